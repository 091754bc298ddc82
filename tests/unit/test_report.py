from __future__ import annotations

from tpunb.events import CellRun
from tpunb.report import cell_summary, format_bytes


def test_bytes_read_naturally_and_unknown_is_not_zero():
    assert format_bytes(None) == "n/a"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(16 * 1024**3) == "16.0 GiB"


def run(**changes) -> CellRun:
    base = dict(
        cell=3,
        mode="debug",
        wall_s=1.234,
        peak_bytes=None,
        groups=0,
        cache_hits=0,
        cache_misses=0,
        error=None,
    )
    return CellRun(**{**base, **changes})


def test_summary_shows_only_what_is_known_and_non_zero():
    assert cell_summary(run()) == "[tpunb] debug · 1.23 s · 0 groups"
    full = cell_summary(
        run(peak_bytes=2 * 1024**2, groups=1, cache_hits=3, cache_misses=1, error="ValueError")
    )
    assert (
        full == "[tpunb] debug · 1.23 s · peak 2.0 MiB · 1 group · cache 3 hit / 1 miss · failed: ValueError"
    )
