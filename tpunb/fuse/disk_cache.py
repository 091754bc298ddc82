"""Where compiled groups persist between kernel restarts: Inductor's on-disk caches.

Inductor keys its FX-graph and kernel caches by content, so a restarted kernel that records
the same group finds the compiled code on disk (tenths of a second instead of seconds).
tpunb only chooses the directory: ``%tpu_cache DIR``, else ``TPUNB_CACHE_DIR``, else a
``TORCHINDUCTOR_CACHE_DIR`` the user already set, else ``<user cache dir>/tpunb/inductor``.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "TPUNB_CACHE_DIR"
INDUCTOR_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpunb" / "inductor"


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
