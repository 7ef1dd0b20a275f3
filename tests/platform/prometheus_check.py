"""Runs every query of the Grafana dashboards (deploy/grafana/*.json) against a real Prometheus
that scrapes a running platform's Ray cluster, and names each panel that comes back empty.

The Prometheus is a throwaway one (scripts/prometheus.sh): it scrapes the targets Ray lists in
its service-discovery file every 2 s, lives only for the check, and is stopped in a `finally`.
Nothing else is started or stopped: the platform (and its traffic) is the caller's.

A panel's query is sent as Grafana would send it with "All" chosen: a query variable becomes
`.*` (the dashboards match it with `=~`), and Grafana's interval variables become fixed ranges.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS_DIR = REPO / "deploy" / "grafana"
PROMETHEUS_SCRIPT = REPO / "scripts" / "prometheus.sh"
DISCOVERY_FILE = "prom_metrics_service_discovery.json"  # Ray's, in its temp root and session dir
SCRAPE_INTERVAL_S = 2
JOB = "switchyard-dashboards"
# rate() needs two samples in its range: 1m holds ~30 at a 2 s scrape. $__range is the dashboards'
# default time range.
GRAFANA_BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
ALL_VALUES = ".*"
# $name, ${name}, ${name:format} and the deprecated [[name]]
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # the dashboard's uid
    panel: str  # the panel's title
    ref_id: str
    expr: str  # as written in the dashboard

    @property
    def key(self) -> str:
        return f"{self.dashboard}: {self.panel}"


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, dict[str, Any]]:
    """Every dashboard JSON file in `directory`, by file name."""
    return {f.name: json.loads(f.read_text()) for f in sorted(directory.glob("*.json"))}


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The dashboard's panels, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(dashboard["uid"], panel.get("title", ""), target.get("refId", ""), target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        if not target.get("hide", False)
    ]


def variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """What the check puts in place of each variable a query may use: "All" for the dashboard's
    own (they are matched as regexes), fixed ranges for Grafana's built-in interval variables."""
    own = {v["name"]: ALL_VALUES for v in dashboard.get("templating", {}).get("list", []) if v["type"] != "datasource"}
    return {**GRAFANA_BUILTINS, **own}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with every variable replaced; a variable not in `values` is a dashboard bug."""

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g is not None)
        if name not in values:
            raise KeyError(f"variable ${name} is not defined in the dashboard (in {expr!r})")
        return values[name]

    return VARIABLE.sub(value, expr)


def discovery_file(ray_temp_dir: Path) -> Path:
    """Ray's service-discovery file for a platform whose Ray temp dir (`short_temp_dir`) is
    `ray_temp_dir`: Ray's temp root is its `ray/` folder (Ray's own root itself also works)."""
    candidates = [ray_temp_dir / "ray" / DISCOVERY_FILE, ray_temp_dir / DISCOVERY_FILE]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"no {DISCOVERY_FILE} in {' or '.join(str(c.parent) for c in candidates)}: is Ray up?")


def prometheus_config(discovery: Path) -> str:
    return json.dumps(  # JSON is YAML: no YAML writer needed for three keys
        {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
            "scrape_configs": [{"job_name": JOB, "file_sd_configs": [{"files": [str(discovery)]}]}],
        },
        indent=2,
    )


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._end = time.monotonic() + timeout_s

    def left(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the dashboards' Prometheus check ran past its {self.timeout_s:.0f}s")
        return left


def check_dashboards_against(ray_temp_dir: Path, timeout_s: float, allow_empty: Collection[str] = ()) -> dict[str, int]:
    """Series each panel's queries return from a Prometheus that scraped the platform whose Ray
    temp dir is `ray_temp_dir`, keyed "<dashboard uid>: <panel title>" (all its targets added).

    Raises AssertionError naming every target that failed or returned no series, except
    empty ones of the panels in `allow_empty` (same keys); TimeoutError past `timeout_s`."""
    deadline = Deadline(timeout_s)
    dashboards = load_dashboards()
    unknown = set(allow_empty) - {q.key for d in dashboards.values() for q in panel_queries(d)}
    if unknown:
        raise ValueError(f"allow_empty names no panel with a query: {sorted(unknown)}")
    discovery = discovery_file(ray_temp_dir)
    work = Path(tempfile.mkdtemp(prefix="sy-prom-check-"))
    data = work / "data"
    try:
        config = work / "prometheus.yml"
        config.write_text(prometheus_config(discovery))
        _, port = _run_script("start", str(config), str(data), timeout_s=deadline.left()).split()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
            _wait_for_scrapes(client, discovery, deadline)
            counts, problems = _run_queries(client, dashboards, set(allow_empty), deadline)
    finally:
        # By the data dir rather than the PID `start` printed: a start cut short by its timeout
        # may have left a server that never printed one.
        for pid in _servers_on(data):
            _run_script("stop", str(pid), timeout_s=30)
        shutil.rmtree(work, ignore_errors=True)
    if problems:
        raise AssertionError(f"{len(problems)} dashboard queries returned no series:\n" + "\n".join(problems))
    return counts


def _run_script(*args: str, timeout_s: float) -> str:
    done = subprocess.run(
        ["bash", str(PROMETHEUS_SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/prometheus.sh {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout.strip()


def _servers_on(data: Path) -> list[int]:
    """PIDs of the Prometheus servers whose data dir is `data` (only ever this check's)."""
    flag = f"--storage.tsdb.path={data}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and flag in (proc / "cmdline").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def _targets(discovery: Path) -> set[str]:
    groups = json.loads(discovery.read_text())
    return {t for group in groups for t in group["targets"]}


def _wait_for_scrapes(client: httpx.Client, discovery: Path, deadline: Deadline) -> None:
    """Until every target Ray lists is up and scraped three times (rate() needs two samples)."""
    wanted = _targets(discovery)
    seen: dict[str, float] = {}
    while True:
        # No job matcher: Ray's target groups set job="ray" themselves, and this server scrapes nothing else.
        up = _query(client, "count_over_time(up[1m]) and on(instance) up == 1")
        seen = {r["metric"]["instance"]: float(r["value"][1]) for r in up}
        if wanted <= {i for i, n in seen.items() if n >= 3}:
            return
        if deadline.left() < SCRAPE_INTERVAL_S:
            raise TimeoutError(f"Prometheus did not scrape every Ray target 3 times in time: want {wanted}, saw {seen}")
        time.sleep(1.0)


def _run_queries(
    client: httpx.Client, dashboards: Mapping[str, Mapping[str, Any]], allow_empty: set[str], deadline: Deadline
) -> tuple[dict[str, int], list[str]]:
    counts: dict[str, int] = {}
    problems: list[str] = []
    for dashboard in dashboards.values():
        values = variable_values(dashboard)
        for q in panel_queries(dashboard):
            deadline.left()
            try:
                series = len(_query(client, substitute(q.expr, values)))
            except (KeyError, QueryError) as exc:
                problems.append(f"  {q.key} [{q.ref_id}]: {exc}")
                continue
            counts[q.key] = counts.get(q.key, 0) + series
            if series == 0 and q.key not in allow_empty:
                problems.append(f"  {q.key} [{q.ref_id}]: no series for {q.expr}")
    return counts, problems


class QueryError(Exception):
    pass


def _query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    """An instant query's result as a list of series (a scalar or string result is one)."""
    response = client.get("/api/v1/query", params={"query": expr})
    body = response.json()
    if body.get("status") != "success":
        raise QueryError(f"{body.get('errorType')}: {body.get('error')} (query {expr!r})")
    result = body["data"]["result"]
    if body["data"]["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": result}]
    return list(result)
