from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tpunb.fuse.groups.disk_cache import INDUCTOR_ENV_VAR, default_cache_dir, intact_elf, use_cache_dir


def test_the_directory_chain(monkeypatch, tmp_path):
    monkeypatch.delenv("TPUNB_CACHE_DIR", raising=False)
    monkeypatch.delenv(INDUCTOR_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "tpunb" / "inductor"
    assert use_cache_dir() == (tmp_path / "xdg" / "tpunb" / "inductor").resolve()
    monkeypatch.setenv(INDUCTOR_ENV_VAR, str(tmp_path / "users-own"))
    assert use_cache_dir() == (tmp_path / "users-own").resolve()
    monkeypatch.setenv("TPUNB_CACHE_DIR", str(tmp_path / "tpunb-env"))
    assert use_cache_dir() == (tmp_path / "tpunb-env").resolve()
    chosen = use_cache_dir(tmp_path / "explicit")
    assert chosen.is_dir() and chosen == (tmp_path / "explicit").resolve()
    assert os.environ[INDUCTOR_ENV_VAR] == str(chosen)


COMPILE_ONCE = """
import sys, torch
if sys.argv[1] == "tpunb":
    from tpunb.runtimes.native import NativeRuntime
    compiled = NativeRuntime().compile_function(lambda x: (x * 3 + 1).relu().sum())
else:
    compiled = torch.compile(lambda x: (x * 3 + 1).relu().sum())
print(float(compiled(torch.arange(8.0))))
"""


def _compile_in_a_new_process(how: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, INDUCTOR_ENV_VAR: str(cache), "TPUNB_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", COMPILE_ONCE, how], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_kernel_binary_torn_by_a_killed_process_is_built_again(tmp_path: Path) -> None:
    first = _compile_in_a_new_process("tpunb", tmp_path)
    assert first.returncode == 0 and float(first.stdout) == 92.0, first.stderr[-2000:]
    binaries = list(tmp_path.rglob("*.main.so"))  # the kernel's (the others probe the CPU's ISA)
    assert binaries
    for binary in binaries:  # what a process killed as the linker starts to write leaves behind
        os.truncate(binary, 0)
    # torch alone loads the torn file (the failure CI saw), and keeps it
    plain = _compile_in_a_new_process("torch", tmp_path)
    assert plain.returncode != 0 and "file too short" in plain.stderr, plain.stderr[-2000:]
    again = _compile_in_a_new_process("tpunb", tmp_path)
    assert again.returncode == 0 and float(again.stdout) == 92.0, again.stderr[-2000:]
    assert all(intact_elf(str(binary)) for binary in binaries)


def test_a_binary_is_intact_only_while_its_headers_point_within_it(tmp_path: Path) -> None:
    assert intact_elf(torch._C.__file__)  # a library built elsewhere (patched, stripped)
    source = tmp_path / "one.c"
    source.write_text("int one(void) { return 1; }\n")
    library = tmp_path / "one.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert intact_elf(str(library))
    whole = library.read_bytes()
    torn = tmp_path / "torn.so"
    for size in (0, 40, len(whole) // 2, len(whole) - 1):  # the linker writes its tables last
        torn.write_bytes(whole[:size])
        assert not intact_elf(str(torn)), size
