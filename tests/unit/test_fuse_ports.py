"""Each collaborator of the fused engine uses only what its Protocol in fuse/ports.py names.

The source of each module is read (not run): every attribute taken of the engine it was
handed, as ``engine.x`` or ``self.engine.x``, must be a member of that module's Protocol. A
new reach into the engine fails here until the Protocol says so.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import tpunb.fuse
from tpunb.fuse import ports

pytestmark = pytest.mark.unit

FUSE = Path(tpunb.fuse.__file__).parent
#: Each module that is handed the engine, and the Protocol it is typed with.
COLLABORATORS = {
    "deferred.py": ports.WrapperEngine,
    "record.py": ports.RecorderEngine,
    "adopt.py": ports.HotPathEngine,
    "hotcalls.py": ports.HotPathEngine,
    "hotsteps.py": ports.HotPathEngine,
    "hot_backward.py": ports.HotPathEngine,
    "hotcode.py": ports.HotPathEngine,
    "whole_runs.py": ports.HotPathEngine,
}


def members(protocol: type) -> set[str]:
    """The attributes and methods a Protocol (and the Protocols it extends) declares."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls.__module__ == ports.__name__:
            names |= set(cls.__annotations__) | {n for n, v in vars(cls).items() if inspect.isfunction(v)}
    return names


#: Each collaborator's source, parsed as the module is collected, before any test runs: on
#: Python 3.11 the AST constructor's recursion count is shared between threads, and an
#: ``ast.parse`` beside an earlier test's background compile failed once with "SystemError:
#: AST constructor recursion depth mismatch" (python/cpython#106905).
#: Every module of tpunb/fuse and its stage subpackages, by file name (unique across them).
MODULE_FILES = [path for path in sorted(FUSE.rglob("*.py")) if path.name != "__init__.py"]
PATHS = {path.name: path for path in MODULE_FILES}
assert len(PATHS) == len(MODULE_FILES), "two modules of tpunb/fuse share a name"
TREES = {module: ast.parse(PATHS[module].read_text()) for module in COLLABORATORS}


def engine_reaches(tree: ast.Module) -> set[str]:
    """The attributes taken of ``engine`` or of ``<anything>.engine`` in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        holder = node.value
        if (isinstance(holder, ast.Name) and holder.id == "engine") or (
            isinstance(holder, ast.Attribute) and holder.attr == "engine"
        ):
            found.add(node.attr)
    return found


@pytest.mark.parametrize("module", sorted(COLLABORATORS))
def test_a_collaborator_reaches_only_what_its_protocol_names(module):
    reached = engine_reaches(TREES[module])
    assert reached, f"{module} no longer uses the engine: drop it from COLLABORATORS"
    protocol = COLLABORATORS[module]
    beyond = reached - members(protocol)
    assert not beyond, f"{module} uses {sorted(beyond)} of the engine, beyond {protocol.__name__}"


def test_the_engine_is_what_each_protocol_says():
    from tpunb.fuse.engine import FusionEngine

    engine = FusionEngine("cpu")
    for protocol in set(COLLABORATORS.values()):
        missing = [name for name in members(protocol) if not hasattr(engine, name)]
        assert not missing, f"FusionEngine lacks {missing} of {protocol.__name__}"
    parts = {"adoption": ports.AdoptionPort, "hot": ports.HotCallsPort, "hot_steps": ports.HotStepsPort}
    for name, protocol in parts.items():
        missing = [
            member
            for member in members(protocol) | properties(protocol)
            if not hasattr(getattr(engine, name), member)
        ]
        assert not missing, f"the engine's {name} lacks {missing} of {protocol.__name__}"


def properties(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if isinstance(v, property)}


#: Every module of tpunb/fuse, parsed as collected (as ``TREES``), for the imports among them.
ALL_TREES = {path.stem: ast.parse(path.read_text()) for path in PATHS.values()}


def fuse_imports(tree: ast.Module) -> set[str]:
    """The tpunb.fuse modules ``tree`` imports, anywhere (type-only imports too), in either form:
    ``from tpunb.fuse.groups.plan import x`` and ``from tpunb.fuse import config``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpunb.fuse"):
            module = node.module.rsplit(".", 1)[-1]
            if module in ALL_TREES:
                found.add(module)
            else:  # from a package: the names that are modules
                found |= {alias.name for alias in node.names if alias.name in ALL_TREES}
    return found


def test_no_module_of_the_engine_imports_itself_back():
    """The modules import one another without a circle, type-only imports included, so each can
    be read after what it builds on: the Protocols in ports.py name what a part uses of another
    instead of importing its class."""
    imports = {name: fuse_imports(tree) for name, tree in ALL_TREES.items()}

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(imports.get(start, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(imports.get(name, ()))
        return seen

    circles = sorted(name for name in imports if name in reaches(name))
    assert not circles, f"these modules import themselves back: {circles}"


#: Code that reaches the engine two ways (parsed as collected, as ``TREES``).
REACHING = ast.parse("def f(engine):\n    engine.trace.ops\n    return self.engine.recorder\n")


def test_the_check_sees_a_reach_beyond_the_protocol():
    assert engine_reaches(REACHING) == {"trace", "recorder"}
    assert "recorder" not in members(ports.HotPathEngine)
