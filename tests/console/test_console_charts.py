"""The console's SVG charts: every datum carries its exact value, sits where its value says, and hostile text
stays text. The expected figures here are computed from the input, not read from the chart's own arithmetic:
positions come from the plot area's pixels and its data range (`data-y-lo`/`data-y-hi` on `rect.plot-area`).
"""

from __future__ import annotations

import itertools
import math
import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from markupsafe import Markup

from switchyard.console.charts import (
    Bar,
    Series,
    bar_chart,
    data_table,
    format_number,
    line_chart,
    stacked_area_chart,
)

T0 = 1714521600.0  # 2024-05-01 00:00:00 UTC
TOL = 0.011  # pixels are written with two decimals
HOSTILE = ['</title><script>alert("x")</script>', '"a&b"', "' onmouseover='x", "]]> <!-- -->", "&amp; &#60;"]


def parse(markup: Markup) -> ET.Element:
    assert isinstance(markup, Markup)
    root = ET.fromstring(str(markup))
    for el in root.iter():
        el.tag = el.tag.rpartition("}")[2]  # drop the SVG namespace
    return root


def data(root: ET.Element) -> list[ET.Element]:
    return [el for el in root.iter() if "datum" in el.get("class", "").split()]


def first(root: ET.Element, tag: str, cls: str | None = None) -> ET.Element:
    found = [el for el in root.iter(tag) if cls is None or cls in el.get("class", "").split()]
    assert found, f"no <{tag} class={cls!r}>"
    return found[0]


def f(el: ET.Element, attr: str) -> float:
    value = el.get(attr)
    assert value is not None, f"<{el.tag}> lacks {attr}"
    return float(value)


@dataclass(frozen=True)
class Area:
    left: float
    top: float
    right: float
    bottom: float
    y_lo: float
    y_hi: float

    @classmethod
    def of(cls, root: ET.Element) -> Area:
        r = first(root, "rect", "plot-area")
        left, top = f(r, "x"), f(r, "y")
        return cls(left, top, left + f(r, "width"), top + f(r, "height"), f(r, "data-y-lo"), f(r, "data-y-hi"))

    def py(self, y: float) -> float:
        """The expected pixel row of a value, computed here (in halves where the range passes the float limit)."""
        lo, hi = (self.y_lo, self.y_hi) if math.isfinite(self.y_hi - self.y_lo) else (self.y_lo / 2, self.y_hi / 2)
        y = y if math.isfinite(self.y_hi - self.y_lo) else y / 2
        return self.bottom - (y - lo) / (hi - lo) * (self.bottom - self.top)

    def holds(self, x: float, y: float) -> bool:
        return self.left - TOL <= x <= self.right + TOL and self.top - TOL <= y <= self.bottom + TOL


def finite_points(series: Sequence[Series]) -> list[tuple[str, float, float]]:
    return [(s.name, x, y) for s in series for x, y in s.points if math.isfinite(x) and math.isfinite(y)]


def assert_exact(el: ET.Element, attr: str, value: float, msg: str = "") -> None:
    assert el.get(attr) == repr(float(value)), f"{msg} {attr}={el.get(attr)!r}, expected {value!r}"
    assert float(el.get(attr, "nan")) == value or (math.isnan(value) and math.isnan(f(el, attr))), msg


def assert_no_data(root: ET.Element) -> None:
    assert not data(root)
    assert first(root, "text", "no-data").text == "no data"


def check_line(root: ET.Element, series: Sequence[Series], msg: str = "") -> None:
    expected = finite_points(series)
    if not expected:
        return assert_no_data(root)
    circles = data(root)
    assert [(c.get("data-series"), f(c, "data-x"), f(c, "data-y")) for c in circles] == expected, msg
    area = Area.of(root)
    ys = [y for *_, y in expected]
    assert area.y_lo <= min(0.0, *ys) and area.y_hi >= max(0.0, *ys), msg
    for c, (_, x, y) in zip(circles, expected, strict=True):
        assert_exact(c, "data-x", x, msg)
        assert_exact(c, "data-y", y, msg)
        assert c.find("title") is not None, msg
        assert area.holds(f(c, "cx"), f(c, "cy")), f"{msg} {c.attrib} outside {area}"
        assert abs(f(c, "cy") - area.py(y)) <= TOL, f"{msg} y={y!r} at {c.get('cy')}, expected {area.py(y)}"
    by_x = sorted(circles, key=lambda c: f(c, "data-x"))
    assert all(f(a, "cx") <= f(b, "cx") for a, b in itertools.pairwise(by_x)), f"{msg} x not monotone"
    by_y = sorted(circles, key=lambda c: f(c, "data-y"))
    assert all(f(a, "cy") >= f(b, "cy") for a, b in itertools.pairwise(by_y)), f"{msg} y not monotone"


def check_stacked(root: ET.Element, series: Sequence[Series], msg: str = "") -> None:
    expected = finite_points(series)
    if not expected:
        return assert_no_data(root)
    rects = data(root)
    assert [(r.get("data-series"), f(r, "data-x"), f(r, "data-y")) for r in rects] == expected, msg
    area = Area.of(root)
    running: dict[float, float] = {}
    columns: dict[float, tuple[float, float]] = {}
    for r, (_, x, y) in zip(rects, expected, strict=True):
        assert_exact(r, "data-y", y, msg)
        base = running.get(x, 0.0)
        running[x] = top = base + y
        upper, lower = f(r, "y"), f(r, "y") + f(r, "height")
        assert f(r, "height") >= 0 and area.holds(f(r, "x"), upper) and area.holds(f(r, "x"), lower), msg
        assert abs(upper - area.py(max(base, top))) <= TOL, f"{msg} segment {x!r},{y!r} top at {upper}"
        assert abs(lower - area.py(min(base, top))) <= 2 * TOL, f"{msg} segment {x!r},{y!r} bottom at {lower}"
        column = (f(r, "x"), f(r, "width"))
        assert columns.setdefault(x, column) == column, f"{msg} one x, one column"
    assert area.y_lo <= min(0.0, *running.values()) and area.y_hi >= max(0.0, *running.values()), msg
    spans = sorted(columns.items())
    assert all(a[1][0] + a[1][1] <= b[1][0] + TOL for a, b in itertools.pairwise(spans)), msg
    assert all(area.left - TOL <= x0 and x0 + w <= area.right + TOL for x0, w in columns.values()), msg


def check_bars(root: ET.Element, bars: Sequence[Bar], msg: str = "") -> None:
    drawn = [b for b in bars if math.isfinite(b.value)]
    limits = [b for b in bars if b.limit is not None and math.isfinite(b.limit)]
    if not drawn and not limits:
        return assert_no_data(root)
    area = Area.of(root)
    rects = data(root)
    assert [(r.get("data-label"), f(r, "data-value")) for r in rects] == [(b.label, b.value) for b in drawn], msg
    assert area.y_lo <= min(0.0, *(b.value for b in drawn), *(b.limit or 0 for b in limits)), msg
    assert area.y_hi >= max(0.0, *(b.value for b in drawn), *(b.limit or 0 for b in limits)), msg
    zero = area.py(0.0)
    for r, b in zip(rects, drawn, strict=True):
        assert_exact(r, "data-value", b.value, msg)
        if b.limit is None:
            assert "data-limit" not in r.attrib, msg
        else:
            assert_exact(r, "data-limit", b.limit, msg)
        y, h = f(r, "y"), f(r, "height")
        assert area.holds(f(r, "x"), y) and area.holds(f(r, "x"), y + h), msg
        assert abs(h - abs(area.py(b.value) - zero)) <= 2 * TOL, f"{msg} bar {b} is {h} px high"
        assert abs((y + h if b.value >= 0 else y) - zero) <= TOL, f"{msg} bar {b} does not start at zero"
    markers = [el for el in root.iter("line") if el.get("class") == "limit"]
    assert [(m.get("data-label"), f(m, "data-limit")) for m in markers] == [(b.label, b.limit) for b in limits], msg
    for m, b in zip(markers, limits, strict=True):
        assert b.limit is not None and abs(f(m, "y1") - area.py(b.limit)) <= TOL, f"{msg} limit of {b}"


def test_line_chart_data_carry_exact_values_and_sit_where_their_values_say() -> None:
    series = [
        Series("tokens/s", tuple((T0 + 60 * i + 0.123, v) for i, v in enumerate([0.1, 1 / 3, 2**-30, 87.25]))),
        Series("errors", ((T0, 1e-7), (T0 + 180.5, 123456789.98765432))),
    ]
    root = parse(line_chart("Traffic", series, y_label="per s"))
    check_line(root, series)
    assert root.tag == "figure" and "chart" in root.get("class", "").split()
    assert root.get("data-chart") == "traffic"
    svg = first(root, "svg")
    assert svg.get("role") == "img"
    assert first(root, "title").get("id") == svg.get("aria-labelledby")
    assert data(root)[0].findtext("title") == "tokens/s, 2024-05-01 00:00:00 UTC: 0.1"
    # x runs from the first to the last x exactly; y from 0 to a round number.
    area = Area.of(root)
    circles = data(root)
    assert min(f(c, "cx") for c in circles) == area.left and max(f(c, "cx") for c in circles) == area.right
    assert (area.y_lo, area.y_hi) == (0.0, 150000000.0)  # steps of 50 M
    assert ["".join(li.itertext()) for li in root.iter("li")] == ["tokens/s", "errors"]


def test_y_axis_runs_from_zero_to_a_round_number_with_round_ticks() -> None:
    root = parse(line_chart("GPUs", [Series("busy", ((T0, 12.0), (T0 + 60, 87.0)))], y_label="GPUs"))
    area = Area.of(root)
    assert (area.y_lo, area.y_hi) == (0.0, 100.0)
    ticks = [t.text for t in first(root, "g", "axis-y").iter("text") if t.get("class") == "tick"]
    assert ticks == ["0", "20", "40", "60", "80", "100"]
    root = parse(line_chart("small", [Series("s", ((0.0, 0.3), (1.0, 0.1)))], y_label="", x_is_time=False))
    assert Area.of(root).y_hi >= 0.3
    ticks = [t.text for t in first(root, "g", "axis-y").iter("text") if t.get("class") == "tick"]
    assert ticks == ["0", "0.1", "0.2", "0.3"]


def test_negative_values_extend_the_axis_below_zero() -> None:
    series = [Series("delta", ((T0, -42.0), (T0 + 60, 17.0), (T0 + 120, -3.5)))]
    root = parse(line_chart("Delta", series, y_label="USD"))
    check_line(root, series)
    assert Area.of(root).y_lo == -60.0  # span 59 in steps of 20
    zero_line = [g for g in root.iter("line") if g.get("class") == "grid" and g.get("stroke") == "#999999"]
    assert len(zero_line) == 1 and abs(f(zero_line[0], "y1") - Area.of(root).py(0.0)) <= TOL


@pytest.mark.parametrize(
    ("span", "pattern", "first_label"),
    [
        (3 * 3600, r"\d\d:\d\d", "00:00"),
        (10 * 86400, r"\d\d-\d\d", "05-01"),
        (100, r"\d\d:\d\d:\d\d", "00:00:00"),
    ],
)
def test_time_ticks_are_utc_and_match_the_span(span: float, pattern: str, first_label: str) -> None:
    root = parse(line_chart("t", [Series("s", ((T0, 1.0), (T0 + span, 2.0)))], y_label=""))
    labels = [t.text or "" for t in first(root, "g", "axis-x").iter("text")]
    assert 2 <= len(labels) <= 7 and labels[0] == first_label
    assert all(re.fullmatch(pattern, label) for label in labels), labels


def test_skipped_values_are_not_drawn_and_break_the_line() -> None:
    nan, inf = math.nan, math.inf
    points = ((T0, 1.0), (T0 + 60, nan), (T0 + 120, 2.0), (nan, 3.0), (T0 + 180, inf), (inf, 1.0), (T0 + 240, -inf))
    series = [Series("s", (*points, (T0 + 300, 4.0)))]
    root = parse(line_chart("gaps", series, y_label=""))
    check_line(root, series)
    assert len(data(root)) == 3
    assert first(root, "path", "line").get("d", "").count("M") == 3
    table = parse(data_table("gaps", series))
    assert [f(td, "data-y") for td in table.iter("td")] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    "series",
    [[], [Series("a", ())], [Series("a", ((math.nan, 1.0), (T0, math.inf)))], [Series("a", ()), Series("b", ())]],
)
def test_no_data_renders_a_figure_that_says_so(series: list[Series]) -> None:
    for chart in (line_chart, stacked_area_chart):
        root = parse(chart("Empty", series, y_label="y"))
        assert_no_data(root)
        assert first(root, "figcaption").text == "Empty"
    assert_no_data(parse(bar_chart("Empty", [], y_label="USD")))
    assert_no_data(parse(bar_chart("Empty", [Bar("a", math.nan), Bar("b", math.inf, math.nan)], y_label="USD")))
    assert first(parse(data_table("Empty", series)), "td", "no-data").text == "no data"


def test_one_point_and_all_equal_values() -> None:
    one = [Series("a", ((T0, 5.0),))]
    root = parse(line_chart("one", one, y_label=""))
    check_line(root, one)
    area = Area.of(root)
    assert f(data(root)[0], "cx") == (area.left + area.right) / 2
    same_x = [Series("a", ((T0, 1.0), (T0, 2.0), (T0, 3.0)))]
    root = parse(line_chart("same x", same_x, y_label=""))
    check_line(root, same_x)
    assert len({c.get("cx") for c in data(root)}) == 1
    zeros = [Series("a", ((T0, 0.0), (T0 + 60, 0.0)))]
    root = parse(line_chart("zeros", zeros, y_label=""))
    check_line(root, zeros)
    assert Area.of(root).y_hi == 1.0 and {f(c, "cy") for c in data(root)} == {Area.of(root).bottom}
    root = parse(stacked_area_chart("one", one, y_label=""))
    check_stacked(root, one)
    area = Area.of(root)
    assert (f(data(root)[0], "x"), f(data(root)[0], "width")) == (area.left, area.right - area.left)
    bars = [Bar("only", 7.0)]
    check_bars(parse(bar_chart("one", bars, y_label="")), bars)


def test_stacked_segments_sum_to_the_total_at_each_x() -> None:
    xs = [T0 + 60 * i for i in range(5)]
    serve, train = [3.0, 4.0, 0.0, 6.0, 2.5], [2.0, 2.0, 5.0, 1.0, 0.5]
    free = [8.0 - a - b for a, b in zip(serve, train, strict=True)]
    split = {"serve": serve, "train": train, "free": free}
    series = [Series(name, tuple(zip(xs, values, strict=True))) for name, values in split.items()]
    root = parse(stacked_area_chart("GPU split", series, y_label="GPUs"))
    check_stacked(root, series)
    area = Area.of(root)
    assert area.y_hi == 8.0
    per_x: dict[float, list[ET.Element]] = {}
    for r in data(root):
        per_x.setdefault(f(r, "data-x"), []).append(r)
    scale = (area.bottom - area.top) / (area.y_hi - area.y_lo)
    for x, rects in per_x.items():
        assert [r.get("data-series") for r in rects] == ["serve", "train", "free"]
        assert abs(sum(f(r, "height") for r in rects) - 8.0 * scale) <= TOL, x
        # bottom-up and touching: each segment starts where the one below it ends
        assert f(rects[0], "y") + f(rects[0], "height") == area.bottom
        assert all(f(a, "y") == f(b, "y") + f(b, "height") for a, b in itertools.pairwise(rects))


def test_stacked_negative_values_and_overflow_do_not_break_the_chart() -> None:
    series = [Series("a", ((1.0, 5.0), (2.0, -3.0))), Series("b", ((1.0, -8.0), (2.0, 1.0)))]
    root = parse(stacked_area_chart("neg", series, y_label="", x_is_time=False))
    check_stacked(root, series)
    assert Area.of(root).y_lo <= -3.0
    huge = [Series("a", ((1.0, 1.5e308),)), Series("b", ((1.0, 1.5e308),))]  # the second would overflow
    root = parse(stacked_area_chart("huge", huge, y_label="", x_is_time=False))
    assert [r.get("data-series") for r in data(root)] == ["a"]


def test_values_at_the_float_limits_stay_inside_the_plot() -> None:
    big = 1.7976931348623157e308
    series = [Series("edge", ((-big, big), (big, -big), (0.0, 5e-324), (1.0, -5e-324), (2.0, 1e-310)))]
    for x_is_time in (True, False):
        check_line(parse(line_chart("edge", series, y_label="", x_is_time=x_is_time)), series)
        root = parse(stacked_area_chart("edge", series, y_label="", x_is_time=x_is_time))
        assert len(data(root)) == 5 and all(Area.of(root).holds(f(r, "x"), f(r, "y")) for r in data(root))
    bars = [Bar("a", big, -big), Bar("b", 5e-324)]
    check_bars(parse(bar_chart("edge", bars, y_label="")), bars)


def test_bars_are_proportional_and_limits_sit_at_their_value() -> None:
    bars = [Bar("team-a", 120.0, 100.0), Bar("team-b", 30.0, 100.0), Bar("team-c", 45.5), Bar("refund", -20.0)]
    root = parse(bar_chart("Spend vs budget", bars, y_label="USD"))
    check_bars(root, bars)
    rects = data(root)
    a, b = rects[0], rects[1]
    assert abs(f(a, "height") / f(b, "height") - 120.0 / 30.0) < 1e-3
    assert [r.get("class") for r in rects] == ["datum over", "datum", "datum", "datum"]
    assert Area.of(root).y_hi >= 120.0 and Area.of(root).y_lo <= -20.0
    only_limit = [Bar("idle", 10.0, 500.0)]
    root = parse(bar_chart("limit above", only_limit, y_label="USD"))
    check_bars(root, only_limit)
    assert Area.of(root).y_hi >= 500.0
    labels = [t.text for t in first(root, "g", "axis-x").iter("text")]
    assert labels == ["idle"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_text_stays_text(name: str) -> None:
    series = [Series(name, ((T0, 1.0), (T0 + 60, 2.0)))]
    for chart in (line_chart, stacked_area_chart):
        root = parse(chart(name, series, y_label=name))
        assert first(root, "figcaption").text == name
        assert first(root, "title").text == name
        assert [el.get("data-series") for el in data(root)] == [name, name]
        assert all((el.find("title").text or "").startswith(name) for el in data(root))  # type: ignore[union-attr]
        assert ["".join(li.itertext()) for li in root.iter("li")] == [name]
        assert first(root, "text", "axis-label").text == name
        assert not list(root.iter("script"))
    root = parse(bar_chart(name, [Bar(name, 1.0, 2.0)], y_label="USD"))
    assert data(root)[0].get("data-label") == name
    assert first(root, "line", "limit").get("data-label") == name
    table = parse(data_table(name, series))
    assert first(table, "caption").text == name
    assert [th.text for th in table.iter("th")][1] == name


def test_characters_xml_cannot_carry_are_replaced() -> None:
    root = parse(line_chart("a\x00b", [Series("c\x1bd\ud800", ((T0, 1.0),))], y_label=""))
    assert first(root, "figcaption").text == "a\ufffdb"
    assert data(root)[0].get("data-series") == "c\ufffdd\ufffd"


def test_output_is_deterministic_and_ids_are_unique_on_a_page() -> None:
    series = [Series("a", ((T0, 1.0), (T0 + 60, 2.0))), Series("b", ((T0, 3.0),))]

    def page() -> str:
        return "".join(
            [
                line_chart("Traffic", series, y_label="req/s"),
                line_chart("Traffic", series, y_label="req/s", key="team-b"),
                stacked_area_chart("Traffic", series, y_label="req/s"),
                line_chart("Traffic!", series, y_label="req/s"),
                bar_chart("Traffic", [Bar("a", 1.0)], y_label="USD"),
                line_chart("Empty", [], y_label=""),
                data_table("Traffic", series),
            ]
        )

    html = page()
    assert html == page()
    root = ET.fromstring(f"<div>{html}</div>")
    ids = [el.get("id") for el in root.iter() if el.get("id")]
    assert len(ids) == len(set(ids)) == 6 * 3
    for svg in root.iter("{http://www.w3.org/2000/svg}svg"):
        assert svg.get("aria-labelledby") in ids and svg.get("aria-describedby") in ids


def test_data_table_has_a_row_per_x_and_a_column_per_series() -> None:
    series = [Series("a", ((T0 + 60, 2.0), (T0, 1.0), (T0, 1.5))), Series("b", ((T0 + 60, 0.25),))]
    root = parse(data_table("Traffic", series, y_format=lambda v: f"{v:.2f}"))
    assert root.tag == "table" and root.get("class") == "chart-data"
    assert [th.text for th in first(root, "thead").iter("th")] == ["time (UTC)", "a", "b"]
    rows = [[(td.get("data-series"), td.get("data-y"), td.text) for td in tr.iter("td")] for tr in root.iter("tr")][1:]
    assert rows == [
        [("a", "1.0", "1.00"), (None, None, None)],
        [("a", "1.5", "1.50"), (None, None, None)],
        [("a", "2.0", "2.00"), ("b", "0.25", "0.25")],
    ]
    assert [th.text for th in first(root, "tbody").iter("th")][-1] == "2024-05-01 00:01:00 UTC"


def test_format_number_and_size_checks() -> None:
    cases = [(0.0, "0"), (-0.0, "0"), (0.30000000000000004, "0.3"), (1234.5678, "1,235"), (12.345, "12.35")]
    cases += [(-0.00012345, "-0.0001234"), (1e20, "1e+20"), (3e-7, "3e-07")]
    assert [format_number(v) for v, _ in cases] == [text for _, text in cases]
    with pytest.raises(ValueError, match="no room"):
        line_chart("tiny", [Series("a", ((0.0, 1.0),))], y_label="", width=50)


def random_value(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.08:
        return math.nan
    if r < 0.12:
        return rng.choice([math.inf, -math.inf])
    if r < 0.22:
        return rng.choice([-1, 1]) * 10 ** rng.uniform(-300, 300)  # within what a sum of a few cannot overflow
    if r < 0.32:
        return -rng.uniform(0, 1000)
    if r < 0.37:
        return 0.0
    return rng.uniform(0, 1000)


def random_name(rng: random.Random) -> str:
    return "".join(rng.choice("ab <>&\"'=/é") for _ in range(rng.randint(0, 8)))


@pytest.mark.parametrize("seed", range(200))
def test_random_inputs_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    msg = f"seed {seed}"
    x_is_time = rng.random() < 0.5
    base = T0 if x_is_time else rng.uniform(-1e6, 1e6)
    step = rng.choice([1.0, 60.0, 3600.0, 86400.0, 0.001])
    grid = [base + step * i for i in range(rng.randint(0, 25))]
    series = []
    for _ in range(rng.randint(0, 4)):
        xs = grid if rng.random() < 0.7 else [rng.choice([*grid, base, math.nan]) for _ in range(rng.randint(0, 10))]
        series.append(Series(random_name(rng), tuple((x, random_value(rng)) for x in xs)))
    title = random_name(rng)
    check_line(parse(line_chart(title, series, y_label=title, x_is_time=x_is_time)), series, msg)
    check_stacked(parse(stacked_area_chart(title, series, y_label="", x_is_time=x_is_time)), series, msg)
    limits = [None, random_value(rng)]
    bars = [Bar(random_name(rng), random_value(rng), rng.choice(limits)) for _ in range(rng.randint(0, 8))]
    check_bars(parse(bar_chart(title, bars, y_label="USD")), bars, msg)
    table = parse(data_table(title, series, x_is_time=x_is_time))
    tds = [td for td in table.iter("td") if "data-x" in td.attrib]
    assert sorted((td.get("data-series"), f(td, "data-x"), f(td, "data-y")) for td in tds) == sorted(
        finite_points(series)
    ), msg
