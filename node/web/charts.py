"""Server-rendered SVG charts for the status pages (no script, no network fetch).

`loss_chart` draws a job's loss history: the training loss as a line, validation
losses as points joined by a dashed line, on a log scale when the loss spans more than
a factor of 10. The SVG carries `data-points` (training points drawn) so that a test,
or a curious reader, can see it grow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{value:.3g}"


def _steps_label(value: float) -> str:
    return f"{value / 1000:g}k" if value >= 10000 else f"{value:g}"


def loss_chart(
    history: Sequence[Sequence[object]],
    total_steps: int = 0,
    final_val: tuple[int, float] | None = None,
    title: str = "loss",
    final_train: tuple[int, float] | None = None,
    *,
    x_label: str = "step",
    names: tuple[str, str, str] = ("training", "validation", "loss"),
) -> Markup:
    """An SVG of `history` ([step, loss, val_loss] rows). `final_val` and `final_train`
    add the figures of the result (validation loss after the last step, mean training
    loss over the last steps) as points at its last step, unless one is there.
    `x_label` and `names` (the line, the points, the y axis) let the same chart show
    other series: a sweep's best value so far and each trial's value."""
    train: list[tuple[float, float]] = []
    val: list[tuple[float, float]] = []
    for row in history:
        if not isinstance(row, list | tuple) or len(row) < 2:
            continue
        step, loss = _num(row[0]), _num(row[1])
        if step is None:
            continue
        if loss is not None:
            train.append((step, loss))
        if len(row) > 2 and (v := _num(row[2])) is not None:
            val.append((step, v))
    for final, series in ((final_val, val), (final_train, train)):
        if final is not None:
            step, v = _num(final[0]), _num(final[1])
            if step is not None and v is not None and all(s != step for s, _ in series):
                series.append((step, v))
    points = train + val
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'data-points="{len(train)}" data-val-points="{len(val)}" '
        f'aria-label="{escape(title)}: {len(train)} training points, {len(val)} validation '
        f'points" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    )
    if not points:
        return Markup(
            head + f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
            f"no {names[2]} reported yet</text></svg>"
        )
    x_max = float(max(total_steps, max(s for s, _ in points), 1))
    losses = [v for _, v in points]
    low, high = min(losses), max(losses)
    log_scale = low > 0 and high / low > 10
    if log_scale:
        y_low = 10 ** math.floor(math.log10(low))
        y_high = 10 ** math.ceil(math.log10(high))

        def ty(v: float) -> float:
            frac = (math.log10(v) - math.log10(y_low)) / (math.log10(y_high) - math.log10(y_low))
            return TOP + (1 - frac) * (HEIGHT - TOP - BOTTOM)

        ticks = [y_low * 10**k for k in range(round(math.log10(y_high / y_low)) + 1)]
    else:
        step_y = _nice_step((high - min(low, 0)) or 1.0, 5)
        y_low = min(0.0, math.floor(low / step_y) * step_y)
        y_high = math.ceil(high / step_y) * step_y or step_y
        if y_high <= high:
            y_high += step_y

        def ty(v: float) -> float:
            return TOP + (1 - (v - y_low) / (y_high - y_low)) * (HEIGHT - TOP - BOTTOM)

        ticks = [y_low + i * step_y for i in range(round((y_high - y_low) / step_y) + 1)]

    def tx(s: float) -> float:
        return LEFT + s / x_max * (WIDTH - LEFT - RIGHT)

    parts = [head]
    for t in ticks:  # horizontal grid and y labels
        y = ty(t)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_fmt(t)}</text>"
        )
    step_x = _nice_step(x_max, 6)
    k = 0
    while k * step_x <= x_max + 1e-9:
        x = tx(k * step_x)
        parts.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"/>'
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
            f"{_steps_label(k * step_x)}</text>"
        )
        k += 1
    parts.append(
        f'<text class="axis" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis" x="14" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2})">'
        f"{escape(names[2])}{' (log)' if log_scale else ''}</text>"
    )
    if train:
        coords = " ".join(f"{tx(s):.1f},{ty(v):.1f}" for s, v in train)
        parts.append(f'<polyline class="series train" points="{coords}"/>')
    if val:
        val.sort()
        if len(val) > 1:
            coords = " ".join(f"{tx(s):.1f},{ty(v):.1f}" for s, v in val)
            parts.append(f'<polyline class="series val" points="{coords}"/>')
        for s, v in val:
            parts.append(
                f'<circle class="dot val" cx="{tx(s):.1f}" cy="{ty(v):.1f}" r="3.5">'
                f"<title>{escape(x_label)} {s:g}: {escape(names[1])} {v:.4g}</title></circle>"
            )
    if train:
        s, v = train[-1]
        parts.append(
            f'<circle class="dot train" cx="{tx(s):.1f}" cy="{ty(v):.1f}" r="3">'
            f"<title>{escape(x_label)} {s:g}: {escape(names[0])} {v:.4g}</title></circle>"
        )
    legend_x = WIDTH - RIGHT - 220
    parts.append(
        f'<g class="legend"><line class="series train" x1="{legend_x}" x2="{legend_x + 18}" '
        f'y1="{TOP + 10}" y2="{TOP + 10}"/><text x="{legend_x + 24}" y="{TOP + 14}">'
        f"{escape(names[0])}</text>"
        f'<line class="series val" x1="{legend_x + 100}" x2="{legend_x + 118}" '
        f'y1="{TOP + 10}" y2="{TOP + 10}"/><text x="{legend_x + 124}" y="{TOP + 14}">'
        f"{escape(names[1])}</text></g>"
    )
    parts.append("</svg>")
    return Markup("".join(parts))
