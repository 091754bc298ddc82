"""The profile's timeline chart: one lane per kind of time, bars where it was spent.

Lanes: ``host`` (the waits: where the host stopped for values), ``tpunb`` (each group's
capture, compile and run, and compile-mode runs) and ``device`` (kernels and copies, where
the runtime is a GPU's). Colours say which phase a bar is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpunb.profiling.report import Profile

LANES = ("host", "tpunb", "device")
COLOURS = {
    "wait": "tab:red",
    "capture": "tab:gray",
    "compile": "tab:orange",
    "run": "tab:blue",
    "device": "tab:green",
}


def phase(name: str) -> str:
    """The colour key of a span, from its name's first word ("run", "capture", ...)."""
    word = name.split(" ", 1)[0]
    return word if word in COLOURS else "device"


def timeline(profile: Profile) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = [lane for lane in LANES if any(span.lane == lane for span in profile.spans)] or ["tpunb"]
    figure, axes = plt.subplots(figsize=(9, 0.5 + 0.6 * len(lanes)))
    for row, lane in enumerate(lanes):
        spans = [span for span in profile.spans if span.lane == lane]
        axes.broken_barh(
            [(span.start, max(span.seconds, profile.wall_s / 2000)) for span in spans],
            (row - 0.35, 0.7),
            facecolors=[COLOURS[phase(span.name)] for span in spans],
        )
    axes.set_yticks(range(len(lanes)), lanes)
    axes.invert_yaxis()  # host on top, device at the bottom
    axes.set_xlim(0, max(profile.wall_s, 1e-6))
    axes.set_xlabel("seconds from the block's start")
    axes.set_title(f"tpunb profile · {profile.mode} · {profile.wall_s:.3f} s", fontsize=10)
    used = {phase(span.name) for span in profile.spans}
    axes.legend(
        handles=[Patch(color=colour, label=key) for key, colour in COLOURS.items() if key in used],
        loc="upper right",
        fontsize=8,
    )
    figure.tight_layout()
    return figure
