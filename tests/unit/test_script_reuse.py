"""``%run`` compiles a script's source to the same code object while it is unchanged."""

from __future__ import annotations

import pytest

from tpunb.script_reuse import ScriptCode


def test_the_same_source_gives_the_same_code_and_a_change_gives_new_code(tmp_path):
    compiler = ScriptCode()
    path = tmp_path / "train.py"
    first = compiler(b"def step():\n    return 1\n", path, "exec")
    assert compiler(b"def step():\n    return 1\n", path, "exec") is first
    changed = compiler(b"def step():\n    return 2\n", path, "exec")
    assert changed is not first
    namespace: dict = {}
    exec(changed, namespace)
    assert namespace["step"]() == 2
    assert first.co_filename == str(path)


def test_code_is_compiled_without_this_modules_future_imports(tmp_path):
    code = ScriptCode()(b"def f(x: undefined_name): pass\n", tmp_path / "a.py", "exec")
    with pytest.raises(NameError, match="undefined_name"):  # evaluated eagerly, as plain Python does
        exec(code, {})
