"""Profile a cell or a block: the top ops, fusion groups and graphs, waits, a timeline, the
saved trace and at most three findings with their fixes (collect.py puts it together)."""

from tpunb.profiling.collect import ProfileError, last_profile, profile, trace_directory
from tpunb.profiling.report import Profile

__all__ = ["Profile", "ProfileError", "last_profile", "profile", "trace_directory"]
