"""Reading torch_xla's graph log (``PT_XLA_DEBUG_LEVEL=2`` + ``PT_XLA_DEBUG_FILE``).

torch_xla appends a block per compiled and per executed graph: the cause ("user
torch_xla.sync", "most likely user code trying to access tensor value before
torch_xla.sync", ...), the graph hash and the Python frames that triggered it. That is the
only place torch_xla says *why* a graph ran and *which* one, so tpunb tails the file and
turns each executed graph into a fusion group. Eager-mode executions are not logged (torch_xla
suppresses the analysis there), which is right: strict mode has no groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^(Compilation|Post Compilation|Execution|Unexpected Execution) Analysis: ?(.*)$")
_FRAME = re.compile(r"^\s+(?P<function>\S+) \((?P<file>.*):(?P<line>\d+)\)$")
_HASH = re.compile(r"Graph Hash: ([0-9a-f]+)")

#: torch_xla's causes, in the words the monitor shows.
CAUSES = {
    "user torch_xla.sync": "torch_xla.sync()",
    "user mark_step": "torch_xla.sync()",
    "most likely user code trying to access tensor value before torch_xla.sync": "value read",
    "most likely user code trying to access tensor value before mark_step": "value read",
}


@dataclass
class GraphRun:
    """One executed graph, as the log describes it."""

    graph_hash: str
    cause: str
    frames: list[tuple[str, str, int]] = field(default_factory=list)  # (function, file, line)
    compiled: bool = False  # a compilation of this graph was logged just before it ran
    unexpected: bool = False  # an execution inside torch_xla.compile(full_graph=True)


@dataclass
class _Block:
    kind: str
    cause: list[str] = field(default_factory=list)
    graph_hash: str = ""
    frames: list[tuple[str, str, int]] = field(default_factory=list)
    section: str = ""


class GraphLog:
    """Incremental reader of one PT_XLA_DEBUG_FILE: ``read()`` returns the graphs executed
    since the last call (complete blocks only; a half-written block waits for next time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._compiled: set[str] = set()  # hashes compiled but not yet seen executing
        self._block: _Block | None = None  # a block still being written when last read

    def skip_to_end(self) -> None:
        """Ignore what the file already holds (runs from before tpunb was watching)."""
        try:
            with open(self.path, "rb") as f:
                self._offset = f.seek(0, 2)
        except OSError:
            self._offset = 0

    def read(self) -> list[GraphRun]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines only
        self._offset += end
        return self._parse(data[:end].decode("utf-8", "replace").splitlines())

    def _parse(self, lines: list[str]) -> list[GraphRun]:
        runs: list[GraphRun] = []
        block = self._block
        for line in lines:
            match = _PREFIX.match(line)
            if match is None:
                continue
            kind, text = match.groups()
            if kind == "Post Compilation":
                continue
            if text.startswith("====="):
                if block is not None and block.kind == kind and block.graph_hash:
                    runs.extend(self._finish(block))
                    block = None
                elif block is None or block.kind != kind:
                    block = _Block(kind)
                continue
            if block is None:
                continue
            self._feed(block, text)
        self._block = block
        return runs

    @staticmethod
    def _feed(block: _Block, text: str) -> None:
        stripped = text.strip()
        if stripped in ("Compilation Cause", "Execution Cause"):
            block.section = "cause"
        elif stripped == "Graph Info:":
            block.section = "graph"
        elif stripped == "Python Frame Triggered Execution:":
            block.section = "frames"
        elif stripped.startswith("-----"):
            block.section = ""
        elif block.section == "cause" and stripped:
            block.cause.append(stripped)
        elif block.section == "graph":
            found = _HASH.search(stripped)
            if found:
                block.graph_hash = found.group(1)
        elif block.section == "frames":
            frame = _FRAME.match(text)
            if frame:
                block.frames.append((frame["function"], frame["file"], int(frame["line"])))

    def _finish(self, block: _Block) -> list[GraphRun]:
        if block.kind == "Compilation":
            self._compiled.add(block.graph_hash)
            return []
        cause = " ".join(block.cause)
        compiled = block.graph_hash in self._compiled
        self._compiled.discard(block.graph_hash)
        return [
            GraphRun(
                graph_hash=block.graph_hash,
                cause=CAUSES.get(cause, cause),
                frames=block.frames,
                compiled=compiled,
                unexpected=block.kind == "Unexpected Execution",
            )
        ]
