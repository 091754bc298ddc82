"""The ``tpunb`` command line: ``tpunb doctor [--selftest] [--json]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpunb", description="tpunb: PyTorch on TPUs, cell by cell.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    doctor = commands.add_parser("doctor", help="check versions, TPU hardware and the runtime choice")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--selftest",
        action="store_true",
        help="also run each mode briefly on the runtime and device a kernel would use",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from tpunb.doctor import doctor_output

        text, ok = doctor_output(selftest=args.selftest, as_json=args.json)
        print(text)
        return 0 if ok else 1
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
