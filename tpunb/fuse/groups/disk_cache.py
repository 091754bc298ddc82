"""Where compiled groups persist between kernel restarts: Inductor's on-disk caches.

Inductor keys its FX-graph and kernel caches by content, so a restarted kernel that records
the same group finds the compiled code on disk (tenths of a second instead of seconds).
tpunb only chooses the directory: ``%tpu_cache DIR``, else ``TPUNB_CACHE_DIR``, else a
``TORCHINDUCTOR_CACHE_DIR`` the user already set, else ``<user cache dir>/tpunb/inductor``.
"""

from __future__ import annotations

import functools
import os
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ENV_VAR = "TPUNB_CACHE_DIR"
INDUCTOR_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"


def user_cache_root() -> Path:
    """``<user cache dir>/tpunb``: where each runtime keeps its compiled programs by default."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpunb"


def default_cache_dir() -> Path:
    return user_cache_root() / "inductor"


def use_cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Point Inductor's caches at ``path`` (or the default chain above); returns the directory."""
    if path is None:
        chosen = os.environ.get(ENV_VAR) or os.environ.get(INDUCTOR_ENV_VAR) or default_cache_dir()
    else:
        chosen = path
    directory = Path(chosen).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_ENV_VAR] = str(directory)
    return directory


def current_cache_dir() -> Path | None:
    value = os.environ.get(INDUCTOR_ENV_VAR)
    return Path(value) if value else None


#: The binaries Inductor builds and links in its cache (C++ kernels, their objects).
ELF_SUFFIXES = (".so", ".o")


def rebuild_torn_binaries() -> None:
    """Inductor builds a half-written kernel binary again instead of loading it.

    Inductor compiles each C++ kernel into its cache directory and, from then on, every process
    that finds the file there loads it without building (``_worker_compile_cpp`` builds only
    what does not exist). A process killed while the compiler writes (a kernel restarted or
    interrupted during a background compile) leaves a truncated file behind, and every later
    compile of that code fails with "file too short", in every kernel sharing the cache, for
    good (seen in CI: a fused group ran op by op from then on). Under the same lock Inductor
    builds under, a binary whose ELF headers point past its end is removed before the build,
    so it is built again. Linux only (ELF); idempotent."""
    if not sys.platform.startswith("linux"):
        return
    from torch._inductor import codecache

    build = getattr(codecache, "_worker_compile_cpp", None)
    if build is None or getattr(build, "_tpunb_checks_torn", False):
        return
    codecache._worker_compile_cpp = _removing_torn_targets(build)


def _removing_torn_targets(build: Callable[[str, Sequence[Any]], None]) -> Callable[..., None]:
    @functools.wraps(build)
    def build_intact(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        from torch._inductor.codecache import LOCK_TIMEOUT
        from torch.utils._filelock import FileLock

        with FileLock(lock_path, timeout=LOCK_TIMEOUT):  # released before ``build`` takes it
            for builder in cpp_builders:
                target = builder.get_target_file_path()
                if target.endswith(ELF_SUFFIXES) and os.path.exists(target) and not intact_elf(target):
                    os.remove(target)
        build(lock_path, cpp_builders)

    build_intact._tpunb_checks_torn = True  # type: ignore[attr-defined]
    return build_intact


def intact_elf(path: str) -> bool:
    """Whether ``path`` holds a whole ELF file: its magic number, and everything its headers
    point at (the program's segments, each section, the section table) within the file."""
    data = Path(path).read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2):
        return False
    order = "<" if data[5] == 1 else ">"
    wide = data[4] == 2  # 64-bit
    header = struct.unpack_from(order + ("QQQIHHHHHH" if wide else "IIIIHHHHHH"), data, 0x18)
    _, segments_at, sections_at, _, _, segment_size, segments, section_size, sections, _ = header
    ends = [segments_at + segment_size * segments, sections_at + section_size * sections]
    if max(ends) > len(data):
        return False
    for n in range(segments):  # p_offset, p_filesz
        offset, size = _fields(
            data, order, segments_at + n * segment_size, wide, (8, 32) if wide else (4, 16)
        )
        ends.append(offset + size)
    for n in range(sections):  # sh_type, sh_offset, sh_size (NOBITS sections take no file space)
        at = sections_at + n * section_size
        (kind,) = struct.unpack_from(order + "I", data, at + 4)
        if kind != SECTION_NOBITS:
            offset, size = _fields(data, order, at, wide, (24, 32) if wide else (16, 20))
            ends.append(offset + size)
    return max(ends) <= len(data)


#: ELF's ``SHT_NOBITS`` (.bss): a section that occupies no space in the file.
SECTION_NOBITS = 8


def _fields(data: bytes, order: str, at: int, wide: bool, offsets: tuple[int, int]) -> tuple[int, int]:
    """Two address-sized fields (an offset and a size) of a header entry at ``at``."""
    kind = order + ("Q" if wide else "I")
    return struct.unpack_from(kind, data, at + offsets[0])[0], struct.unpack_from(
        kind, data, at + offsets[1]
    )[0]
