"""Wiring tpunb into an IPython kernel: magics plus the cell hooks.

Loaded by ``%load_ext tpunb`` or ``c.InteractiveShellApp.extensions = ["tpunb"]``.
Loading again is harmless: hooks are registered once per shell.
"""

from __future__ import annotations

from typing import Any

from tpunb.fuse.groups.idle_imports import LOADED, import_when_idle
from tpunb.labcomm import close_lab_link, open_lab_link
from tpunb.magics import TpuMagics
from tpunb.report import cell_summary, load_line
from tpunb.session import Session, get_session
from tpunb.source import running_cell_number
from tpunb.tracebacks import install_tracebacks, show_message_only, uninstall_tracebacks


class CellHooks:
    """``pre_run_cell``/``post_run_cell``: open the cell's mode scope, close it, summarise."""

    def __init__(self, shell: Any, session: Session, compile_prefix: Any) -> None:
        self.shell, self.session = shell, session
        self.compile_prefix = compile_prefix

    def pre_run_cell(self, info: Any) -> None:
        self.session.begin_cell(running_cell_number(self.shell), getattr(info, "raw_cell", None))

    def post_run_cell(self, result: Any) -> None:
        error = result.error_in_exec or result.error_before_exec
        try:
            record = self.session.end_cell(error)
        except Exception as failure:  # deferred work failed as the cell's scope closed
            show_message_only(self.shell, failure)
            result.error_in_exec = failure  # the kernel replies with the cell's error
            records = self.session.bus.recent("cell", 1)
            record = records[0] if records else None
        if (
            record is not None
            and (record.mode != "strict" or record.precision != "fp32")
            and self.session.summary_enabled
            and not (only_line_magics(result.info.raw_cell) and not record.error)
        ):
            print(cell_summary(record))
        if result.error_in_exec is not None:
            cell = record.cell if record is not None else running_cell_number(self.shell)
            for line in self.session.explain_failure(result.error_in_exec, self.shell.user_ns, cell):
                print(f"[tpunb] {line}")

    def register(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.shell.input_transformers_cleanup.append(self.compile_prefix)

    def unregister(self) -> None:
        self.shell.events.unregister("pre_run_cell", self.pre_run_cell)
        self.shell.events.unregister("post_run_cell", self.post_run_cell)
        if self.compile_prefix in self.shell.input_transformers_cleanup:
            self.shell.input_transformers_cleanup.remove(self.compile_prefix)


def only_line_magics(source: str | None) -> bool:
    """A cell like ``%tpu_mode strict``: the magic reports what it did, and a summary line
    of a cell that ran no tensor work ("0 groups") would only be noise."""
    lines = [line.strip() for line in (source or "").splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    return bool(code) and all(line.startswith("%") and not line.startswith("%%") for line in code)


_HOOKS_ATTR = "_tpunb_cell_hooks"


def load(shell: Any, version: str) -> None:
    session = get_session()
    if getattr(shell, _HOOKS_ATTR, None) is None:
        magics = TpuMagics(shell, session)
        shell.register_magics(magics)
        hooks = CellHooks(shell, session, magics.compile_prefix)
        hooks.register()
        install_tracebacks(shell)
        setattr(shell, _HOOKS_ATTR, hooks)
    if getattr(shell, "kernel", None) is not None:  # a kernel, so maybe a JupyterLab page
        open_lab_link(session, version, shell.kernel)
    import_when_idle(LOADED)  # every mode but strict needs Dynamo at its first op
    print(load_line(session, version))


def unload(shell: Any) -> None:
    hooks = getattr(shell, _HOOKS_ATTR, None)
    if hooks is not None:
        hooks.unregister()
        uninstall_tracebacks(shell)
        setattr(shell, _HOOKS_ATTR, None)
    close_lab_link()
