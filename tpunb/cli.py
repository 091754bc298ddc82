"""The ``tpunb`` command line: ``tpunb doctor [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpunb", description="tpunb: PyTorch on TPUs, cell by cell.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    doctor = commands.add_parser("doctor", help="check versions, TPU hardware and the runtime choice")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from tpunb.doctor import format_report, run_checks

        report = run_checks()
        print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
        return 0 if report.ok else 1
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
