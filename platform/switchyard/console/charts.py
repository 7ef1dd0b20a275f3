"""Server-side SVG charts for the console and the offline report: line, stacked area, bar, and a data table.

Standard library and markupsafe only: no JS, no network, same input gives the same bytes. Each chart is a
`<figure class="chart">` that is also well-formed XML. Every plotted datum is its own SVG element carrying its
exact value (`data-series`, `data-x`, `data-y` as `repr(float)`, which round-trips), so a browser test can read
the figures back out of the DOM. Non-finite values are skipped, never drawn.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

# Okabe-Ito: stays distinguishable under the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
_OVER_LIMIT = "#D55E00"
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 10, 30  # margins around the plot area, px
# Time-axis steps (s): the first that gives at most 6 ticks; longer spans use whole days.
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_MIN_TIME, _MAX_TIME = -62135596800.0, 253402300799.0  # what datetime can show: years 1 to 9999
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class Series:
    """One named line or stack layer; points are drawn in the given order."""

    name: str
    points: tuple[tuple[float, float], ...]
    """(x, y); x is usually a unix time in seconds."""


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    limit: float | None = None
    """Drawn as a marker line across the bar, e.g. the budget against the amount spent."""


def format_number(value: float) -> str:
    """The default value format: about four significant digits, thousands separated; e-notation when extreme."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if not -4 <= magnitude < 15:
        return f"{value:.3g}"
    text = f"{value:,.{max(0, 3 - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    y_label: str,
    x_is_time: bool = True,
    width: int = 640,
    height: int = 220,
    y_format: Callable[[float], str] = format_number,
    key: str = "",
) -> Markup:
    """A path per series and a `<circle class="datum">` per point. `key` tells apart two charts with the same
    title on one page (it only changes the element ids)."""
    return _xy_chart("line", title, series, y_label, x_is_time, width, height, y_format, key)


def stacked_area_chart(
    title: str,
    series: Sequence[Series],
    *,
    y_label: str,
    x_is_time: bool = True,
    width: int = 640,
    height: int = 220,
    y_format: Callable[[float], str] = format_number,
    key: str = "",
) -> Markup:
    """Series stacked bottom-up in the given order at each x. Drawn as adjacent columns, one per x, so each
    segment is its own `<rect class="datum">` (an area with a step edge). A negative value stacks downward
    from the running total; a segment whose running total would overflow is skipped."""
    return _xy_chart("stacked", title, series, y_label, x_is_time, width, height, y_format, key)


def bar_chart(
    title: str,
    bars: Sequence[Bar],
    *,
    y_label: str,
    width: int = 640,
    height: int = 220,
    y_format: Callable[[float], str] = format_number,
    key: str = "",
) -> Markup:
    """One `<rect class="datum">` per bar (class `over` above its limit) and a `<line class="limit">` per limit."""
    values = [v for b in bars for v in (b.value, b.limit) if v is not None and math.isfinite(v)]
    if not values:
        return _empty("bar", title, key, width, height)
    y_lo, y_hi, y_step = _y_domain(values)
    plot = _Plot.fit(title, width, height, 0.0, 1.0, y_lo, y_hi)
    slot = (plot.right - plot.left) / len(bars)
    labels, parts, over_any, limit_any = [], [], False, False
    for i, bar in enumerate(bars):
        x, w, label = round(plot.left + (i + 0.2) * slot, 2), round(slot * 0.6, 2), _text(bar.label)
        labels.append((round(plot.left + (i + 0.5) * slot, 2), _truncate(bar.label, slot)))
        limit = bar.limit if bar.limit is not None and math.isfinite(bar.limit) else None
        limit_attr = "" if bar.limit is None else f' data-limit="{_num(bar.limit)}"'
        if math.isfinite(bar.value):
            over = limit is not None and bar.value > limit
            over_any |= over
            upper, lower = plot.py(max(bar.value, 0.0)), plot.py(min(bar.value, 0.0))
            hover = f"{bar.label}: {y_format(bar.value)}" + ("" if limit is None else f" of {y_format(limit)}")
            parts.append(
                f'<rect class="datum{" over" if over else ""}" x="{x}" y="{upper}" width="{w}" '
                f'height="{round(lower - upper, 2)}" fill="{_OVER_LIMIT if over else PALETTE[0]}" '
                f'data-label="{label}" data-value="{_num(bar.value)}"{limit_attr}><title>{_text(hover)}</title></rect>'
            )
        if limit is not None:
            limit_any = True
            y, reach = plot.py(limit), round(slot * 0.1, 2)  # the marker overhangs the bar so it shows above it
            parts.append(
                f'<line class="limit" x1="{round(x - reach, 2)}" x2="{round(x + w + reach, 2)}" y1="{y}" y2="{y}" '
                f'stroke="#000000" stroke-width="2" stroke-dasharray="4 2" data-label="{label}"{limit_attr}>'
                f"<title>{_text(f'{bar.label} limit: {y_format(limit)}')}</title></line>"
            )
    axes = _axes(plot, labels, _ticks(y_lo, y_hi, y_step), y_label, y_format, with_x=False)
    legend = [(y_label, f"background:{PALETTE[0]}")]
    legend += [("over limit", f"background:{_OVER_LIMIT}")] if over_any else []
    legend += [("limit", "border-top:2px dashed #000000;height:0")] if limit_any else []
    desc = f"Bar chart of {len(bars)} bars; y: {y_label}."
    return _figure("bar", title, key, width, height, desc, legend, axes + "".join(parts))


def data_table(
    title: str,
    series: Sequence[Series],
    *,
    x_is_time: bool = True,
    y_format: Callable[[float], str] = format_number,
) -> Markup:
    """The numbers of a line or stacked chart as a `<table class="chart-data">`: a row per x, a column per
    series; a series with several points at one x fills as many rows. Cells carry the same data-* values."""
    cells: dict[tuple[float, int], dict[int, float]] = {}
    for i, s in enumerate(series):
        seen: dict[float, int] = {}
        for x, y in s.points:
            if _finite(x, y):
                seen[x] = seen.get(x, -1) + 1
                cells.setdefault((x, seen[x]), {})[i] = y
    head = "".join(f'<th scope="col" data-series="{_text(s.name)}">{_text(s.name)}</th>' for s in series)
    rows = []
    for x, nth in sorted(cells):
        row = cells[(x, nth)]
        tds = "".join(
            f'<td data-series="{_text(s.name)}" data-x="{_num(x)}" data-y="{_num(row[i])}">'
            f"{_text(y_format(row[i]))}</td>"
            if i in row
            else "<td></td>"
            for i, s in enumerate(series)
        )
        rows.append(f'<tr><th scope="row" data-x="{_num(x)}">{_text(_x_text(x, x_is_time))}</th>{tds}</tr>')
    body = "".join(rows) or f'<tr><td colspan="{len(series) + 1}" class="no-data">no data</td></tr>'
    return Markup(
        f'<table class="chart-data" data-chart="{_slug(title)}"><caption>{_text(title)}</caption>'
        f'<thead><tr><th scope="col">{"time (UTC)" if x_is_time else "x"}</th>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _xy_chart(
    kind: str,
    title: str,
    series: Sequence[Series],
    y_label: str,
    x_is_time: bool,
    width: int,
    height: int,
    y_format: Callable[[float], str],
    key: str,
) -> Markup:
    stacked = _segments(series, stack=kind == "stacked")
    segments = [seg for segs in stacked for seg in segs]
    if not segments:
        return _empty(kind, title, key, width, height)
    xs = sorted({x for x, *_ in segments})
    y_lo, y_hi, y_step = _y_domain([top for *_, top in segments])
    plot = _Plot.fit(title, width, height, xs[0], xs[-1], y_lo, y_hi)
    parts = [_axes(plot, _x_ticks(plot, x_is_time), _ticks(y_lo, y_hi, y_step), y_label, y_format, with_x=True)]
    centers = [plot.px(x) for x in xs]  # a stacked column spans halfway to its neighbours
    edges = [plot.left, *(round((a + b) / 2, 2) for a, b in itertools.pairwise(centers)), plot.right]
    column = {x: (edges[i], round(edges[i + 1] - edges[i], 2)) for i, x in enumerate(xs)}
    for i, (s, segs) in enumerate(zip(series, stacked, strict=True)):
        color, name = PALETTE[i % len(PALETTE)], _text(s.name)
        crisp = ' shape-rendering="crispEdges"' if kind == "stacked" else ""  # adjacent columns, no seams
        parts.append(f'<g class="series" data-series="{name}" fill="{color}"{crisp}>')
        if kind == "line":
            path = _line_path(plot, s.points)
            parts.append(f'<path class="line" d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        r = 2.5 if len(segs) * 8 <= plot.right - plot.left else 1.5  # dense series: the line, not the dots
        for x, y, base, top in segs:
            hover = f"{s.name}, {_x_text(x, x_is_time)}: {y_format(y)}"
            if kind == "line":
                tag, shape = "circle", f'cx="{plot.px(x)}" cy="{plot.py(y)}" r="{r}"'
            else:
                (left, w), upper, lower = column[x], plot.py(max(base, top)), plot.py(min(base, top))
                tag, shape = "rect", f'x="{left}" y="{upper}" width="{w}" height="{round(lower - upper, 2)}"'
                hover += f" (total {y_format(top)})"
            parts.append(
                f'<{tag} class="datum" {shape} data-series="{name}" data-x="{_num(x)}" data-y="{_num(y)}">'
                f"<title>{_text(hover)}</title></{tag}>"
            )
        parts.append("</g>")
    what = "Line chart" if kind == "line" else "Stacked area chart (bottom to top)"
    desc = f"{what} of {', '.join(s.name for s in series)}; y: {y_label}."
    legend = [(s.name, f"background:{PALETTE[i % len(PALETTE)]}") for i, s in enumerate(series)]
    return _figure(kind, title, key, width, height, desc, legend, "".join(parts))


def _line_path(plot: _Plot, points: Sequence[tuple[float, float]]) -> str:
    path, move = [], "M"
    for x, y in points:  # a skipped value breaks the line rather than bridging the gap
        if _finite(x, y):
            path.append(f"{move}{plot.px(x)},{plot.py(y)}")
        move = "L" if _finite(x, y) else "M"
    return " ".join(path)


@dataclass(frozen=True)
class _Plot:
    """The plot area in pixels and the data ranges it shows."""

    left: float
    top: float
    right: float
    bottom: float
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    @classmethod
    def fit(cls, title: str, width: int, height: int, x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> _Plot:
        if width - _LEFT - _RIGHT < 20 or height - _TOP - _BOTTOM < 20:
            raise ValueError(f"chart {title!r}: {width}x{height} px leaves no room for the plot")
        return cls(float(_LEFT), float(_TOP), float(width - _RIGHT), float(height - _BOTTOM), x_lo, x_hi, y_lo, y_hi)

    def px(self, x: float) -> float:
        return round(self.left + _fraction(x, self.x_lo, self.x_hi) * (self.right - self.left), 2)

    def py(self, y: float) -> float:
        return round(self.bottom - _fraction(y, self.y_lo, self.y_hi) * (self.bottom - self.top), 2)


def _fraction(v: float, lo: float, hi: float) -> float:
    if hi == lo:
        return 0.5  # one x value: drawn in the middle
    if math.isinf(hi - lo):  # only near the float limits; halves keep it finite
        return (v / 2 - lo / 2) / (hi / 2 - lo / 2)
    return (v - lo) / (hi - lo)


def _nice(raw: float) -> float | None:
    """`raw` rounded up to 1, 2 or 5 times a power of ten; None near the float limits (the caller keeps raw ends)."""
    if not 1e-300 < raw < 1e300:
        return None
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _y_domain(values: Sequence[float]) -> tuple[float, float, float | None]:
    """(lo, hi, tick step): from 0, or the minimum when negative, to a round number at or above every value."""
    lo, hi = min(0.0, *values), max(0.0, *values)
    if lo == hi:
        return 0.0, 1.0, 0.2
    step = _nice((hi / 2 - lo / 2) / 5 * 2)
    if step is None:
        return lo, hi, None
    nice_lo, nice_hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    if not (math.isfinite(nice_lo) and math.isfinite(nice_hi)):  # rounding out would pass the float limit
        return lo, hi, step
    return min(nice_lo, lo), max(nice_hi, hi), step  # min/max: k * step can land an ulp inside


def _ticks(lo: float, hi: float, step: float | None) -> list[float]:
    if lo == hi or step is None:
        return [lo] if lo == hi else [lo, hi]
    first, last = lo / step, hi / step
    if not (math.isfinite(first) and math.isfinite(last)):
        return [lo, hi]
    ks = range(math.ceil(first - 1e-9), math.floor(last + 1e-9) + 1)[:20]
    return [min(max(k * step, lo), hi) for k in ks] or [lo, hi]


def _x_ticks(plot: _Plot, x_is_time: bool) -> list[tuple[float, str]]:
    lo, hi = plot.x_lo, plot.x_hi
    if not x_is_time:
        return [(plot.px(x), format_number(x)) for x in _ticks(lo, hi, _nice((hi / 2 - lo / 2) / 5 * 2))]
    span = hi - lo
    step = next((float(s) for s in _TIME_STEPS if span / s <= 6), None)
    if step is None:
        days = _nice(span / 86400 / 6)
        step = None if days is None else days * 86400
    fmt = "%H:%M:%S" if step is not None and step < 60 else "%H:%M" if span <= 2 * 86400 else "%m-%d"
    return [(plot.px(x), _time_text(x, fmt)) for x in _ticks(lo, hi, step)]


def _axes(
    plot: _Plot,
    x_ticks: list[tuple[float, str]],
    y_ticks: list[float],
    y_label: str,
    y_format: Callable[[float], str],
    *,
    with_x: bool,
) -> str:
    """The plot-area frame (its data ranges in data-* attributes), y grid and labels, x ticks and labels."""
    x_range = f' data-x-lo="{_num(plot.x_lo)}" data-x-hi="{_num(plot.x_hi)}"' if with_x else ""
    w, h = round(plot.right - plot.left, 2), round(plot.bottom - plot.top, 2)
    parts = [
        f'<rect class="plot-area" x="{plot.left}" y="{plot.top}" width="{w}" height="{h}" fill="none"{x_range} '
        f'data-y-lo="{_num(plot.y_lo)}" data-y-hi="{_num(plot.y_hi)}"/><g class="axis axis-y">'
    ]
    for v in y_ticks:
        y = plot.py(v)
        parts.append(
            f'<line class="grid" x1="{plot.left}" x2="{plot.right}" y1="{y}" y2="{y}" '
            f'stroke="{"#999999" if v == 0 else "#e5e5e5"}"/><text class="tick" x="{plot.left - 6}" '
            f'y="{round(y + 4, 2)}" text-anchor="end">{_text(y_format(v))}</text>'
        )
    mid = round((plot.top + plot.bottom) / 2, 2)
    parts.append(
        f'<text class="axis-label" transform="translate(12,{mid}) rotate(-90)" text-anchor="middle">'
        f'{_text(y_label)}</text></g><g class="axis axis-x"><line x1="{plot.left}" x2="{plot.right}" '
        f'y1="{plot.bottom}" y2="{plot.bottom}" stroke="#333333"/>'
    )
    for x, label in x_ticks:
        # A label centred on a tick at the right edge would be cut by the figure: end it there.
        anchor = "end" if plot.right - x < 4 * len(label) else "middle"
        parts.append(
            f'<line x1="{x}" x2="{x}" y1="{plot.bottom}" y2="{plot.bottom + 4}" stroke="#333333"/>'
            f'<text class="tick" x="{x}" y="{plot.bottom + 16}" text-anchor="{anchor}">{_text(label)}</text>'
        )
    return "".join(parts) + "</g>"


def _figure(
    kind: str, title: str, key: str, width: int, height: int, desc: str, legend: list[tuple[str, str]], body: str
) -> Markup:
    slug = _slug(title)
    digest = hashlib.sha256("\0".join((kind, _clean(title), _clean(key))).encode()).hexdigest()[:8]
    base = f"chart-{slug}-{digest}"
    items = "".join(
        f'<li><span class="swatch" style="display:inline-block;width:10px;height:10px;margin-right:4px;{css}">'
        f"</span>{_text(name)}</li>"
        for name, css in legend
    )
    legend_html = (
        f'<ul class="chart-legend" style="list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;'
        f'gap:2px 12px;font-size:12px">{items}</ul>'
        if legend
        else ""
    )
    return Markup(
        f'<figure class="chart chart-{kind}" data-chart="{slug}" id="{base}"><figcaption>{_text(title)}</figcaption>'
        f'{legend_html}<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby="{base}-title" '
        f'aria-describedby="{base}-desc" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'style="display:block;max-width:100%;height:auto" font-family="system-ui, sans-serif" font-size="11">'
        f'<title id="{base}-title">{_text(title)}</title><desc id="{base}-desc">{_text(desc)}</desc>'
        f"{body}</svg></figure>"
    )


def _empty(kind: str, title: str, key: str, width: int, height: int) -> Markup:
    text = f'<text class="no-data" x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666666">no data</text>'
    return _figure(kind, title, key, width, height, "No data.", [], text)


def _segments(series: Sequence[Series], *, stack: bool) -> list[list[tuple[float, float, float, float]]]:
    """Per series, its finite points as (x, y, base, top); stacked bottom-up in series order at each x."""
    running: dict[float, float] = {}
    out = []
    for s in series:
        segments = []
        for x, y in s.points:
            base = running.get(x, 0.0) if stack else 0.0
            if _finite(x, y) and math.isfinite(base + y):
                segments.append((float(x), float(y), base, base + y))
                running[x] = base + y
        out.append(segments)
    return out


def _finite(x: float, y: float) -> bool:
    return math.isfinite(x) and math.isfinite(y)


def _num(v: float) -> str:
    return repr(float(v))  # round-trips exactly through float()


def _clean(text: str) -> str:
    return _XML_ILLEGAL.sub("\ufffd", text)  # characters XML (and so inline SVG) cannot carry at all


def _text(text: str) -> str:
    return str(escape(_clean(text)))


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "chart"


def _truncate(label: str, slot: float) -> str:
    room = max(1, int(slot / 6.5))  # ~6.5 px per character at 11 px; the bar's title keeps the full label
    return label if len(label) <= room else label[: room - 1] + "…"


def _time_text(x: float, fmt: str) -> str:
    if not _MIN_TIME <= x <= _MAX_TIME:
        return format_number(x)
    return datetime.fromtimestamp(x, UTC).strftime(fmt)


def _x_text(x: float, x_is_time: bool) -> str:
    return _time_text(x, "%Y-%m-%d %H:%M:%S UTC") if x_is_time else format_number(x)
