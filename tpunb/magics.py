"""IPython magics: parse, then call the session. Nothing else lives here.

``%%tpu_mode`` runs its cell the way ``%%time`` does (AST, then exec in the user
namespace, then eval of a trailing expression), compiled under the cell's own file name
with the cell's line numbers so tracebacks and debug-mode errors name ``Cell In[N], line L``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from tpunb.cellcompile import CompileModePrefix, NotCompilable
from tpunb.mixed_precision import Precision, PrecisionError, parse_precision
from tpunb.modes import Mode, ModeConfig, ModeError
from tpunb.report import mode_table
from tpunb.session import Session
from tpunb.source import running_cell_number

MODE_NAMES = tuple(mode.value for mode in Mode)
PRECISION_NAMES = tuple(precision.value for precision in Precision)


def positive_count(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more, got {text!r}")
    return value


def parse_magic_line(magic: Callable[..., Any], line: str, prefix: str = "%") -> argparse.Namespace:
    """``parse_argstring``, with an error that names what was wrong and lists what is accepted:
    argparse alone says ``unrecognized arguments: strict`` and leaves the user guessing."""
    try:
        return parse_argstring(magic, line)
    except UsageError as error:
        name = magic.__name__
        usage = " ".join(magic.parser.format_usage().split()).replace(f"%{name}", f"{prefix}{name}", 1)
        raise UsageError(f"{prefix}{name}: {error}. Accepted: {usage} (more: {prefix}{name}?)") from None


@magics_class
class TpuMagics(Magics):
    """``%tpu_mode``, ``%%tpu_mode``, ``%tpu_precision``, ``%%tpu_precision``, ``%%tpu_profile``,
    ``%tpu_summary``, ``%tpu_cache``, ``%tpu_monitor``, ``%tpu_doctor``, ``%%tpu_distributed``."""

    def __init__(self, shell: Any, session: Session) -> None:
        super().__init__(shell)
        self.session = session
        #: registered as an input transformer by the extension: compile as the default mode
        self.compile_prefix = CompileModePrefix(lambda: session.default.mode.value)

    @magic_arguments()
    @argument(
        "mode",
        nargs="?",
        type=str.lower,
        choices=MODE_NAMES,
        help="debug, strict, fused or compile (any case). Omit it to show the current mode.",
    )
    @argument("--allow-nan", action="store_true", help="debug mode: do not stop at a new NaN.")
    @argument("--allow-inf", action="store_true", help="debug mode: do not stop at a new Inf.")
    @argument(
        "--sync-compile",
        action="store_true",
        help="fused mode: compile a new group before running it (default: run it op by op "
        "while a background thread compiles it); on TorchTPU, a trained model is compiled whole "
        "from its second step, the call waiting for it.",
    )
    @argument(
        "--hot-training",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fused mode: compile a module trained again and again whole, forward and backward, "
        "and run the loop around it as eager PyTorch (the default on torch 2.13 and later); "
        "--no-hot-training records every training call instead (on TorchTPU: leaves it to "
        "DEFER_AND_FUSE).",
    )
    @line_cell_magic
    def tpu_mode(self, line: str, cell: str | None = None) -> Any:
        """Show or set the execution mode.

        As a line magic, ``%tpu_mode MODE`` sets the mode of this and the following cells.
        As a cell magic, ``%%tpu_mode MODE`` runs just that cell in MODE and restores the
        previous mode afterwards, even if the cell raises.

        Examples::

            %tpu_mode                 # the current mode and what each mode does
            %tpu_mode fused           # defer and fuse from now on
            %tpu_mode debug --allow-inf

            %%tpu_mode debug
            y = torch.log(x)          # a NaN born here raises, naming this line
        """
        __tracebackhide__ = True
        args = parse_magic_line(self.tpu_mode, line, "%" if cell is None else "%%")
        if args.mode is None:
            if cell is not None:
                raise UsageError("%%tpu_mode needs a mode: debug, strict, fused or compile")
            print(mode_table(self.session))
            return None
        try:
            config = ModeConfig.build(
                args.mode,
                allow_nan=args.allow_nan,
                allow_inf=args.allow_inf,
                sync_compile=args.sync_compile,
                **({} if args.hot_training is None else {"hot_training": args.hot_training}),
            )
            if cell is None:
                previous = self.session.default.describe()
                self.session.set_default(config, source="magic")
                print(f"tpunb: mode {config.describe()} (was {previous})")
                return None
            self.session.check_supported(config)
        except ModeError as error:
            raise UsageError(f"%tpu_mode: {error}") from None
        return self._run_cell(f"%%tpu_mode {line}", cell, config)

    def _run_cell(self, header: str, cell: str, config: ModeConfig) -> Any:
        """Run a cell magic's body in ``config``; ``header`` is the magic's line, so that the
        body's line numbers are the cell's."""
        __tracebackhide__ = True
        shell = self.shell
        raw = f"{header}\n{cell}"
        number = running_cell_number(shell)
        filename = shell.compile.cache(raw, number, raw_code=raw)
        with self.compile_prefix.suspended():
            body = shell.transform_cell(cell)
        tree = shell.compile.ast_parse(body, filename=filename)
        ast.increment_lineno(tree, 1)  # the body starts on the cell's second line
        tree = shell.transform_ast(tree)
        with self.session.scoped(config, whole_cell=True):
            if config.mode is Mode.COMPILE:
                try:
                    return self.session.cell_compiler.run(tree, cell, filename, shell.user_ns, number)
                except NotCompilable as reason:
                    print(f"tpunb: this cell runs uncompiled ({reason})")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(shell.compile(tree, filename, "exec"), shell.user_ns)
            if last is not None:
                expression = ast.Expression(last.value)
                return eval(shell.compile(expression, filename, "eval"), shell.user_ns)
        return None

    @magic_arguments()
    @argument(
        "precision",
        nargs="?",
        type=str.lower,
        choices=PRECISION_NAMES,
        help="fp32 (off), bf16 or fp16 (autocast to bfloat16 or float16); omit it to show the current one.",
    )
    @line_cell_magic
    def tpu_precision(self, line: str, cell: str | None = None) -> Any:
        """Show or set the precision ops run in: ``fp32``, ``bf16`` or ``fp16`` (autocast).

        As a line magic, ``%tpu_precision bf16`` sets it for this and the following cells;
        as a cell magic, ``%%tpu_precision bf16`` runs just that cell in it and restores the
        previous precision afterwards, even if the cell raises. It combines with every mode.
        A precision the runtime cannot run is refused with the reason. For fp16 on a GPU,
        ``tpunb.grad_scaler()`` scales the loss (and is a pass-through everywhere else).

        Example::

            %tpu_precision bf16
            %tpu_mode fused
        """
        __tracebackhide__ = True
        prefix = "%" if cell is None else "%%"
        args = parse_magic_line(self.tpu_precision, line, prefix)
        session = self.session
        if args.precision is None:
            if cell is not None:
                raise UsageError(f"%%tpu_precision needs a precision: {', '.join(PRECISION_NAMES)}")
            print(
                f"tpunb: precision {session.effective_precision} "
                f"(accepted on this runtime: {', '.join(session.available_precisions)})"
            )
            return None
        precision = parse_precision(args.precision)
        try:
            session.check_precision(precision)
        except PrecisionError as error:
            raise UsageError(f"{prefix}tpu_precision: {error}") from None
        if cell is None:
            previous = session.default_precision
            session.set_precision(precision)
            print(f"tpunb: precision {precision} (was {previous})")
            return None
        with session.precision_scoped(precision, whole_cell=True):
            return self._run_cell(f"%%tpu_precision {line}", cell, session.effective)

    @magic_arguments()
    @argument(
        "--mode",
        type=str.lower,
        choices=MODE_NAMES,
        help="run the cell in this mode (debug, strict, fused or compile); default: the current mode.",
    )
    @argument(
        "--trace", metavar="DIR", help="where to save the trace (default: tpunb-profiles in the temp dir)."
    )
    @argument("--top", type=positive_count, metavar="N", help="how many ops to list (default 10).")
    @argument(
        "--shapes",
        action="store_true",
        help="record the ops' input shapes on the native runtime too (there it keeps fused mode "
        "from adopting tensors, so fused cells run slower while profiled).",
    )
    @cell_magic
    def tpu_profile(self, line: str, cell: str) -> Any:
        """Run the cell under the runtime's profiler and show, under it: the top ops, the fusion
        groups and graphs that ran, the waits (where the host stopped for values), a timeline,
        the saved trace's path and at most three findings with their fixes. The same report is
        ``tpunb.last_profile()`` afterwards. A cell that raises shows the report up to the error.

        Example::

            %%tpu_profile --mode fused
            for batch in loader:
                train_step(batch)
        """
        __tracebackhide__ = True
        from IPython.display import display

        from tpunb.profiling import ProfileError, profile

        args = parse_magic_line(self.tpu_profile, line, "%%")
        profiling = contextlib.ExitStack()
        try:  # everything checked before the cell runs
            config = ModeConfig.build(args.mode) if args.mode is not None else self.session.effective
            shapes = True if args.shapes else None  # None: the runtime's default (collect.py)
            report = profiling.enter_context(
                profile(mode=args.mode, trace=args.trace, top=args.top, shapes=shapes)  # top None: 10
            )
        except (ModeError, ProfileError) as error:
            raise UsageError(f"%%tpu_profile: {error}") from None
        try:
            with profiling:
                return self._run_cell(f"%%tpu_profile {line}", cell, config)
        finally:
            display(report)  # filled in by now, also when the cell raised

    @magic_arguments()
    @argument("state", nargs="?", choices=("on", "off"), help="on or off; omit to show.")
    @line_magic
    def tpu_summary(self, line: str) -> None:
        """Turn the one-line summary after each non-strict cell on or off."""
        args = parse_magic_line(self.tpu_summary, line)
        if args.state is not None:
            self.session.summary_enabled = args.state == "on"
        print(f"tpunb: cell summaries {'on' if self.session.summary_enabled else 'off'}")

    @magic_arguments()
    @argument("directory", nargs="?", help="where compiled programs are kept; omit to show it.")
    @line_magic
    def tpu_cache(self, line: str) -> None:
        """Show or set the runtime's persistent compile cache, which makes a restarted kernel's
        compiles cheap: Inductor's caches on native (``TPUNB_CACHE_DIR`` or
        ``~/.cache/tpunb/inductor`` by default), torch_xla's persistent cache on XLA and the
        tier-3 cache on TorchTPU (both only before the first computation).
        """
        from tpunb.runtimes import CacheDirError

        args = parse_magic_line(self.tpu_cache, line)
        try:
            current = self.session.runtime.cache_dir(args.directory)
        except CacheDirError as error:
            raise UsageError(f"%tpu_cache: {error}") from None
        print(f"tpunb: compile cache at {current or 'the default (set on first use)'}")

    @magic_arguments()
    @line_magic
    def tpu_monitor(self, line: str) -> Any:
        """Show the live monitor: device memory over time, fusion groups, compile cache.

        It updates while long cells run. Without a widget frontend (terminal IPython) it
        prints a text snapshot; nbconvert and nbval keep the same snapshot as text.
        """
        from tpunb.monitoring import has_widget_frontend, monitor_widget, text_snapshot

        parse_magic_line(self.tpu_monitor, line)
        if not has_widget_frontend():
            print(text_snapshot(self.session))
            return None
        return monitor_widget(self.session)

    @magic_arguments()
    @argument(
        "--selftest",
        action="store_true",
        help="also run each mode briefly on this kernel's runtime and device (about 30 s on a CPU).",
    )
    @argument("--json", action="store_true", help="print it as JSON, for a bug report.")
    @line_magic
    def tpu_doctor(self, line: str) -> None:
        """Check this environment (versions, TPU hardware, runtime choice), as `tpunb doctor`;
        ``--selftest`` runs debug, strict, fused and compile mode on this kernel's device."""
        from tpunb.doctor import doctor_output

        args = parse_magic_line(self.tpu_doctor, line)
        print(doctor_output(selftest=args.selftest, as_json=args.json)[0])

    @magic_arguments()
    @argument("-n", "--nprocs", type=int, required=True, help="worker processes to start on this machine.")
    @argument(
        "--backend",
        default="auto",
        help="process-group backend: auto (gloo on CPU, nccl on CUDA, xla on PyTorch/XLA, tpu on "
        "TorchTPU), gloo, nccl, xla or tpu.",
    )
    @argument(
        "--return",
        dest="returns",
        nargs="+",
        default=[],
        metavar="NAME",
        help="variables of rank 0 to bring back into the notebook after the cell.",
    )
    @argument(
        "--save",
        metavar="DIR",
        help="instead of running, write the job to DIR and print the torchrun command that runs "
        "it on several hosts (TPU pods, GPU machines).",
    )
    @cell_magic
    def tpu_distributed(self, line: str, cell: str) -> None:
        """Run the cell on N worker processes of torch.distributed (torchrun's elastic launcher).

        Each worker has RANK, WORLD_SIZE, LOCAL_RANK, DEVICE and an initialised process group,
        the notebook's imports and the (picklable) variables the cell uses, and runs in the
        notebook's tpunb mode. Output comes back as it happens, prefixed [rank k]. A failure
        on any rank stops them all and names the rank and the cell line; interrupting the
        cell stops every worker.

        Example::

            %%tpu_distributed -n 2 --return losses
            model = DDP(make_model())
            ...
        """
        __tracebackhide__ = True
        from tpunb.distributed.backend import BACKENDS
        from tpunb.distributed.cell import run_distributed_cell
        from tpunb.distributed.job import UnpicklableVariables

        args = parse_magic_line(self.tpu_distributed, line, "%%")
        if args.nprocs < 1:
            raise UsageError(f"%%tpu_distributed: -n must be at least 1, not {args.nprocs}")
        if args.backend not in BACKENDS:
            raise UsageError(
                f"%%tpu_distributed: unknown backend {args.backend!r}; accepted: {', '.join(BACKENDS)}"
            )
        try:
            run_distributed_cell(
                self.shell,
                self.session,
                cell,
                nprocs=args.nprocs,
                backend=args.backend,
                returns=tuple(args.returns),
                save=args.save,
            )
        except UnpicklableVariables as error:
            raise UsageError(str(error)) from None
