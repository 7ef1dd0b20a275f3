"""The Grafana dashboards in deploy/grafana/ are well formed and query only metrics the
platform exports: each file against deploy/grafana/dashboard-schema.yaml, then what a schema
cannot say (unique panel ids, a grid without overlaps, datasources that name the datasource
variable, every variable defined, every PromQL metric name one the platform defines).

The exported names are derived from the platform's own `ray.util.metrics` definitions, read
from the source (no Ray import), and named as Ray exports them to Prometheus: a `ray_` prefix,
`_total` on counters (once), `_bucket`/`_sum`/`_count` on histograms. Renaming a metric in the
code fails this test until the dashboards follow. Whether each query returns series from a real
platform is tests/platform/prometheus_check.py's job.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.platform.prometheus_check import DASHBOARDS_DIR, load_dashboards, panel_queries, panels, substitute
from tests.platform.prometheus_check import variable_values as check_values

REPO = Path(__file__).resolve().parents[2]
PLATFORM_SOURCE = REPO / "platform" / "switchyard"
SCHEMA_FILE = DASHBOARDS_DIR / "dashboard-schema.yaml"
GRID_COLUMNS = 24
RAY_METRIC_CLASSES = {"Counter", "Gauge", "Histogram"}
# Ray Train's own metrics (ray/train/v2/_internal/metrics, Ray 2.60), as its workers and
# controller export them; the live check confirms the ones the dashboards use.
RAY_TRAIN_METRICS = frozenset(
    {
        "ray_train_report_total_blocked_time_s",
        "ray_train_checkpoint_sync_total_time_s",
        "ray_train_checkpoint_transfer_total_time_s",
        "ray_train_controller_state",
        "ray_train_worker_group_start_total_time_s",
        "ray_train_worker_group_shutdown_total_time_s",
    }
)
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
PROMQL_KEYWORDS |= {"offset", "inf", "nan"}

DASHBOARDS = load_dashboards()


# -- what the platform exports ---------------------------------------------------------------
def defined_metrics(source: Path = PLATFORM_SOURCE) -> dict[str, str]:
    """Every `ray.util.metrics` Counter, Gauge and Histogram the platform creates: name -> class."""
    found: dict[str, str] = {}
    for path in sorted(source.rglob("*.py")):
        text = path.read_text()
        if "ray.util.metrics" not in text:  # parsing all of the platform would take seconds
            continue
        tree = ast.parse(text, filename=str(path))
        classes = {
            alias.asname or alias.name: alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "ray.util.metrics"
            for alias in node.names
            if alias.name in RAY_METRIC_CLASSES
        }
        if not classes:
            continue
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
                found[_metric_name(node, constants, path)] = classes[node.func.id]
    return found


def _metric_name(call: ast.Call, constants: dict[str, str], path: Path) -> str:
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name) and arg.id in constants:
        return constants[arg.id]
    raise AssertionError(f"{path}:{call.lineno}: a metric whose name this test cannot read (a literal or a constant)")


def prometheus_names(name: str, kind: str) -> set[str]:
    """The series names Ray's Prometheus endpoint gives metric `name` of class `kind`."""
    base = f"ray_{name}"
    if kind == "Counter":
        return {base if base.endswith("_total") else f"{base}_total"}
    if kind == "Histogram":
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return {base}


@cache
def exported_names() -> frozenset[str]:
    names = set(RAY_TRAIN_METRICS)
    for name, kind in defined_metrics().items():
        names |= prometheus_names(name, kind)
    return frozenset(names)


# -- reading PromQL --------------------------------------------------------------------------
def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, label names or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    words = re.findall(r"(?<![\w$:.])([A-Za-z_:][\w:]*)\b(?!\s*\()", text)
    return {w for w in words if w.lower() not in PROMQL_KEYWORDS}


def variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "") if isinstance(query, dict) else query)


def label_values_selector(query: str) -> str | None:
    """The series selector of a `label_values(selector, label)` variable query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    return match.group(1) if match else None


# -- the dashboards --------------------------------------------------------------------------
def test_there_are_the_three_dashboards() -> None:
    assert set(DASHBOARDS) == {"switchyard-gateway.json", "switchyard-scheduler.json", "switchyard-training.json"}


def test_uids_and_titles_are_unique() -> None:
    uids = [d["uid"] for d in DASHBOARDS.values()]
    titles = [d["title"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_matches_the_schema(name: str) -> None:
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(DASHBOARDS[name]), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_and_titles_are_unique(name: str) -> None:
    all_panels = list(panels(DASHBOARDS[name]))
    ids = [p["id"] for p in all_panels]
    titles = [p["title"] for p in all_panels]  # the live check reports panels by title
    assert len(set(ids)) == len(ids), f"duplicate panel ids in {name}"
    assert len(set(titles)) == len(titles), f"duplicate panel titles in {name}"
    for p in all_panels:
        ref_ids = [t["refId"] for t in p.get("targets", [])]
        assert len(set(ref_ids)) == len(ref_ids), f"{name} / {p['title']}: duplicate refIds"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    boxes = [(p["title"], p["gridPos"]) for p in DASHBOARDS[name]["panels"]]
    for title, g in boxes:
        assert g["x"] + g["w"] <= GRID_COLUMNS, f"{name} / {title} runs past column {GRID_COLUMNS}"
    for (a, ga), (b, gb) in itertools.combinations(boxes, 2):
        apart = (
            ga["x"] + ga["w"] <= gb["x"]
            or gb["x"] + gb["w"] <= ga["x"]
            or ga["y"] + ga["h"] <= gb["y"]
            or gb["y"] + gb["h"] <= ga["y"]
        )
        assert apart, f"{name}: '{a}' and '{b}' overlap"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasources_name_the_datasource_variable(name: str) -> None:
    dashboard = DASHBOARDS[name]
    variables = dashboard["templating"]["list"]
    datasource_vars = {v["name"] for v in variables if v["type"] == "datasource"}
    assert datasource_vars, f"{name} has no datasource variable: it would be tied to one Grafana's datasource"
    refs = [("variable " + v["name"], v["datasource"]) for v in variables if "datasource" in v]
    for p in panels(dashboard):
        refs += [(p["title"], p["datasource"])] if "datasource" in p else []
        refs += [(f"{p['title']} [{t['refId']}]", t["datasource"]) for t in p.get("targets", [])]
    for where, ref in refs:
        assert ref["uid"].strip("${}") in datasource_vars, f"{name} / {where}: datasource {ref['uid']}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_variable_a_query_uses_is_defined(name: str) -> None:
    values = check_values(DASHBOARDS[name])
    for q in panel_queries(DASHBOARDS[name]):
        assert "$" not in substitute(q.expr, values), f"{q.key} [{q.ref_id}]"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_queries_name_only_metrics_the_platform_exports(name: str) -> None:
    dashboard = DASHBOARDS[name]
    used: list[tuple[str, str]] = [(f"{q.key} [{q.ref_id}]", q.expr) for q in panel_queries(dashboard)]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            selector = label_values_selector(variable_query(v))
            assert selector is not None, f"{name}: variable {v['name']} is not a label_values() query"
            used.append((f"variable {v['name']}", selector))
    unknown = [(where, sorted(metric_names(expr) - exported_names())) for where, expr in used]
    unknown = [(where, names) for where, names in unknown if names]
    assert not unknown, "metrics no platform code defines:\n" + "\n".join(f"  {w}: {n}" for w, n in unknown)
    assert all(metric_names(expr) for _, expr in used), "a query that selects no metric"


# -- the checks themselves -------------------------------------------------------------------
def test_the_exported_names_come_from_the_metric_definitions() -> None:
    defined = defined_metrics()
    assert defined["switchyard_gateway_requests"] == "Counter"
    assert defined["switchyard_audit_spool_backlog"] == "Gauge"  # named by a module constant
    assert defined["switchyard_scheduler_serve_replicas"] == "Gauge"
    names = exported_names()
    assert "ray_switchyard_gateway_requests_total" in names
    assert "ray_switchyard_scheduler_preemptions_total" in names  # `_total` added once only
    assert "ray_switchyard_scheduler_preemptions_total_total" not in names
    assert {"ray_switchyard_gateway_request_seconds_bucket", "ray_switchyard_budget_spent_usd"} <= names
    assert "ray_switchyard_gateway_requests" not in names  # a counter is only seen with `_total`


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, team) (rate(ray_a_bucket{team=~"$team",x="y z"}[$__rate_interval])))'
        " / ignoring(le) group_left() sum(ray_b_total offset 5m) or vector(0) and on() 1e3 * ray_c"
    )
    assert metric_names(expr) == {"ray_a_bucket", "ray_b_total", "ray_c"}


def test_a_renamed_metric_is_caught() -> None:
    expr = 'sum(rate(ray_switchyard_gateway_request_total{team=~".*"}[1m]))'  # "requests", misspelt
    assert metric_names(expr) - exported_names() == {"ray_switchyard_gateway_request_total"}


def test_an_undefined_variable_is_caught() -> None:
    with pytest.raises(KeyError, match=r"\$tenant"):
        substitute('sum(x{team=~"$team",tenant=~"${tenant}"})', {"team": ".*"})


def test_the_schema_refuses_what_grafana_would() -> None:
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    good = DASHBOARDS["switchyard-gateway.json"]
    validator = jsonschema.Draft202012Validator(schema)
    no_grid = {**good, "panels": [{k: v for k, v in good["panels"][0].items() if k != "gridPos"}]}
    fixed_datasource = {**good, "panels": [{**good["panels"][0], "datasource": {"type": "prometheus", "uid": "P1"}}]}
    no_targets = {**good, "panels": [{**good["panels"][0], "targets": []}]}
    for bad in (no_grid, fixed_datasource, no_targets, {k: v for k, v in good.items() if k != "uid"}):
        assert not validator.is_valid(bad)
    assert validator.is_valid(good)
