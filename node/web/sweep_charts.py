"""Server-rendered SVGs of a sweep: params against value, and what mattered most.

`parallel_coordinates` draws one vertical axis per searched key and one for the
sweep's metric; each complete trial is a line across them, darker the better its
value, the best one highlighted, so the region of good values shows at a glance.
`importance_bars` draws the share of the value's variation each key explains
(`training.sweep.study.importances`). Both carry counts as data attributes for tests.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from markupsafe import Markup, escape

from node.web.charts import HEIGHT, WIDTH

LEFT, RIGHT, TOP, BOTTOM = 70, 70, 28, 28


def parallel_coordinates(
    space: dict[str, dict[str, Any]], trials: list[dict[str, Any]], metric: str, direction: str
) -> Markup:
    """`space` is the sweep's plain `space`; `trials` the job's trials (complete ones
    are drawn)."""
    done = [
        t
        for t in trials
        if t.get("state") == "complete" and isinstance(t.get("value"), int | float)
    ]
    head = (
        f'<svg class="chart parallel" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'data-lines="{len(done)}" aria-label="params against {escape(metric)}: '
        f'{len(done)} complete trials" xmlns="http://www.w3.org/2000/svg">'
        f"<title>params against {escape(metric)}</title>"
    )
    if not done:
        return Markup(
            head + f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" '
            'text-anchor="middle">no complete trial yet</text></svg>'
        )
    values = [float(t["value"]) for t in done]
    axes = [*((key, _axis(key, spec, done)) for key, spec in space.items())]
    axes.append((metric, _range_axis(values, log=False)))
    gap = (WIDTH - LEFT - RIGHT) / max(len(axes) - 1, 1)
    parts = [head]
    for i, (name, axis) in enumerate(axes):
        x = LEFT + i * gap
        parts.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"/>'
            f'<text class="axis" x="{x:.1f}" y="{TOP - 10}" text-anchor="middle">'
            f"{escape(name)}</text>"
        )
        for label, frac in axis["ticks"]:
            y = _y(frac)
            parts.append(
                f'<text class="tick" x="{x - 5:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                f"{escape(label)}</text>"
            )
    sign = 1.0 if direction == "minimize" else -1.0
    ranked = sorted(done, key=lambda t: -sign * float(t["value"]))  # worst first, best on top
    for rank, trial in enumerate(ranked):
        points = []
        for i, (name, axis) in enumerate(axes):
            raw = trial["value"] if i == len(axes) - 1 else trial["params"].get(name)
            points.append(f"{LEFT + i * gap:.1f},{_y(axis['place'](raw)):.1f}")
        best = rank == len(ranked) - 1
        shade = 0.25 + 0.6 * rank / max(len(ranked) - 1, 1)
        parts.append(
            f'<polyline class="trial{" best" if best else ""}" points="{" ".join(points)}" '
            f'style="opacity:{1.0 if best else shade:.2f}" data-trial="{trial["number"]}">'
            f"<title>trial {trial['number']}: {escape(metric)} {float(trial['value']):.5g}"
            "</title></polyline>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def importance_bars(importances: dict[str, float]) -> Markup:
    """Horizontal bars, largest first; empty until two trials have completed."""
    rows = sorted(importances.items(), key=lambda kv: -kv[1])
    height = 24 + 26 * max(len(rows), 1)
    head = (
        f'<svg class="chart importances" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'data-bars="{len(rows)}" aria-label="parameter importances" '
        f'xmlns="http://www.w3.org/2000/svg"><title>parameter importances</title>'
    )
    if not rows:
        return Markup(
            head + f'<text class="empty" x="{WIDTH / 2}" y="30" text-anchor="middle">'
            "importances need two complete trials</text></svg>"
        )
    label_w, bar_w = 200, WIDTH - 200 - 80
    parts = [head]
    for i, (key, share) in enumerate(rows):
        y = 12 + 26 * i
        parts.append(
            f'<text class="tick" x="{label_w - 8}" y="{y + 14}" text-anchor="end">'
            f"{escape(key)}</text>"
            f'<rect class="bar" x="{label_w}" y="{y}" width="{max(share, 0.0) * bar_w:.1f}" '
            f'height="18"/><text class="tick" x="{label_w + max(share, 0.0) * bar_w + 6:.1f}" '
            f'y="{y + 14}">{share:.2f}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _y(frac: float) -> float:
    """0 (bottom) .. 1 (top) to the SVG's y."""
    return TOP + (1 - frac) * (HEIGHT - TOP - BOTTOM)


def _axis(key: str, spec: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, Any]:
    if "choices" in spec:
        labels = [_label(c) for c in spec["choices"]]
        slots = max(len(labels) - 1, 1)
        place = {label: (i / slots if len(labels) > 1 else 0.5) for i, label in enumerate(labels)}
        return {
            "ticks": list(place.items()),
            "place": lambda raw: place.get(_label(raw), 0.5),
        }
    return _range_axis([float(spec["low"]), float(spec["high"])], log=bool(spec.get("log")))


def _range_axis(values: list[float], log: bool) -> dict[str, Any]:
    low, high = min(values), max(values)
    log = log and low > 0

    def scale(v: float) -> float:
        return math.log10(v) if log else v

    span = (scale(high) - scale(low)) or 1.0

    def place(raw: Any) -> float:
        v = float(raw) if isinstance(raw, int | float) else low
        v = min(max(v, low), high)
        return (scale(v) - scale(low)) / span if high > low else 0.5

    ticks = [(f"{v:.3g}", place(v)) for v in ([low, high] if high > low else [low])]
    return {"ticks": ticks, "place": place}


def _label(choice: Any) -> str:
    """A choice as shown: lists (a `model.hidden`) in JSON, whether the trial's params
    hold a list or the JSON text the study uses."""
    if isinstance(choice, str) and choice.startswith("["):
        with contextlib.suppress(ValueError):
            choice = json.loads(choice)
    return json.dumps(choice) if isinstance(choice, list | tuple) else str(choice)
