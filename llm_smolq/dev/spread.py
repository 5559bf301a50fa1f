"""Figures over repeated runs as the dev reports give them: the median with the min-max."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict:
    """The median of values, their min and their max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(s: dict, spec: str = ".2f") -> str:
    """A spread as "median (min-max)", each number formatted by spec."""
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"
