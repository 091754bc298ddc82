from __future__ import annotations

from tpunb.fuse.disk_cache import INDUCTOR_ENV_VAR, default_cache_dir, use_cache_dir


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
    import os

    assert os.environ[INDUCTOR_ENV_VAR] == str(chosen)
