"""Each console view's content: the figures (JSON, the data endpoints' answer) and the charts
drawn from them (the page). Role checks are the app's; these functions assume they passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from switchyard.audit.query import AuditQuery
from switchyard.console import figures
from switchyard.console.charts import Bar, Series, bar_chart, data_table, line_chart, stacked_area_chart
from switchyard.console.sources import PlatformReader
from switchyard.console.templating import template_env
from switchyard.policy.keys import Principal


@dataclass
class View:
    title: str
    template: str
    data: dict[str, Any]  # JSON: what /api/... answers, and what the page shows
    charts: dict[str, Markup] = field(default_factory=dict)


def month_start(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-01")


def team_overview(reader: PlatformReader, team: str, since: float, now: float) -> View:
    records = reader.request_records(team, since)
    window = figures.Window.covering(figures.first_time(since, (r.time for r in records)), now)
    traffic = figures.traffic_series(records, window)
    team_policy = reader.policy_set().teams.get(team)
    used = None if team_policy is None else team_policy.allowed_providers
    circuits = {
        p: c for p, c in (reader.circuits() or {}).items() if used is None or p in used
    }  # the providers this team may use (all, when its policy does not restrict them)
    scheduler = reader.scheduler_view()
    jobs = [] if scheduler is None else _team_jobs(scheduler, team)
    return View(
        f"Team {team}",
        "team.html",
        {
            "team": team,
            "since": since,
            "until": now,
            "bucket_s": window.bucket_s,
            "traffic": figures.traffic_counts(records),
            "traffic_series": _series_json(traffic),
            "circuits": circuits,
            "jobs": {
                state: sum(1 for j in jobs if j["state"] == state) for state in sorted({j["state"] for j in jobs})
            },
        },
        {
            "traffic": line_chart("Requests per bucket", traffic, y_label="requests"),
            "traffic_table": data_table("Requests per bucket", traffic),
        },
    )


def team_spend(reader: PlatformReader, team: str, now: float) -> View:
    first = month_start(now)
    report = reader.spend(team, first)
    today = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    by_day = figures.spend_by_day(report["spend"], figures.days_between(first, today))
    bars = figures.budget_bars(report["budgets"])
    return View(
        f"Team {team}: spend",
        "spend.html",
        {**report, "by_flow": figures.spend_by_flow(report["spend"])},
        {
            "by_day": line_chart("Spend per day by flow (USD)", by_day, y_label="USD", y_format=_usd),
            "by_day_table": data_table("Spend per day by flow (USD)", by_day, y_format=_usd),
            "budgets": bar_chart("Budget used (% of its limit)", bars, y_label="% of limit"),
        },
    )


def team_jobs(reader: PlatformReader, team: str) -> View:
    scheduler = reader.scheduler_view()
    jobs = [] if scheduler is None else _team_jobs(scheduler, team)
    return View(f"Team {team}: jobs", "jobs.html", {"team": team, "scheduler": scheduler is not None, "jobs": jobs})


def job_detail(reader: PlatformReader, team: str, workload_id: str) -> View | None:
    """None: no such job of this team."""
    scheduler = reader.scheduler_view()
    if scheduler is None:
        return None
    job = next((j for j in _team_jobs(scheduler, team) if j["workload_id"] == workload_id), None)
    if job is None:
        return None
    events = [e for e in scheduler["events"] if e["workload_id"] == workload_id]
    lines = reader.run_metrics(team, str(job["description"]))
    curves = figures.run_curves(lines)
    losses = [s for s in (curves["loss"], curves["val_loss"]) if s.points]
    return View(
        f"Job {workload_id}",
        "job.html",
        {
            "team": team,
            "job": job,
            "events": events,
            "steps": len(lines),
            "curves": {name: [list(p) for p in s.points] for name, s in curves.items()},
        },
        {
            "loss": line_chart("Loss by step", losses, y_label="loss", x_is_time=False),
            "throughput": line_chart(
                "Tokens per second by step", [curves["tokens_per_s"]], y_label="tokens/s", x_is_time=False
            ),
        },
    )


def team_audit(
    reader: PlatformReader, who: Principal, team: str | None, flow: str | None, since: float, bodies: bool
) -> View:
    """Recent records (bodies only where the data policy lets this role read them; such a read
    is itself audited)."""
    records = reader.audit_query(who, AuditQuery(team, flow, since, bodies, limit=figures.MAX_BUCKETS * 10))
    return View(
        "Audit" if team is None else f"Team {team}: audit",
        "audit.html",
        {"team": team, "flow": flow, "since": since, "bodies": bodies, "records": records[-200:]},
    )


def auditor(
    reader: PlatformReader, who: Principal, team: str | None, flow: str | None, since: float, bodies: bool
) -> View:
    view = team_audit(reader, who, team, flow, since, bodies)
    view.data["chain"] = reader.verify_chain()
    view.template = "auditor.html"
    return view


def operator(reader: PlatformReader, since: float, now: float) -> View:
    scheduler = reader.scheduler_view()
    if scheduler is None:
        return View("Operator", "operator.html", {"scheduler": False})
    status = scheduler["status"]
    events = [figures.flat_event(e) for e in scheduler["events"]]
    window = figures.Window.covering(figures.first_time(since, (float(e["at"]) for e in events)), now)
    total = float(status.get("total_gpus", 0))
    split = figures.gpu_split_series(events, total, window)
    teams = status.get("teams", [])
    used = [Bar(t["team"], float(t["used_gpus"]), float(t["guaranteed_gpus"])) for t in teams]
    return View(
        "Operator",
        "operator.html",
        {
            "scheduler": True,
            "since": since,
            "until": now,
            "gpus_now": figures.gpu_split(figures.leased_gpus(events), total),
            "gpu_split_series": _series_json(split),
            "teams": teams,
            "waits": status.get("waits", {}),
            "fairness": status.get("fairness", {}),
            "preemptions": figures.preemptions_by_team(events),
            "cause_chains": figures.cause_chains(events),
            "nodes": scheduler["nodes"],
            "pools": status.get("pools", []),
            "pending": status.get("pending", []),
            "policy": _policy_state(reader),
        },
        {
            "gpu_split": stacked_area_chart("GPUs: serve, train, free", split, y_label="GPUs"),
            "gpu_split_table": data_table("GPUs: serve, train, free", split),
            "team_gpus": bar_chart("GPUs used against guarantee, per team", used, y_label="GPUs"),
        },
    )


def _team_jobs(scheduler: dict[str, Any], team: str) -> list[dict[str, Any]]:
    mine = [w for w in scheduler["workloads"] if w["team"] == team]
    return figures.job_rows(mine, [figures.flat_event(e) for e in scheduler["events"]])


def _policy_state(reader: PlatformReader) -> dict[str, Any]:
    """The last applied and the last rejected policy change, from the head's change journal."""
    journal = reader.state / "policy_changes.jsonl"
    applied: dict[str, Any] | None = None
    rejected: dict[str, Any] | None = None
    if journal.is_file():
        for raw in journal.read_bytes().splitlines():
            try:
                change = json.loads(raw)  # bytes that are not UTF-8 raise a ValueError too
            except ValueError:
                continue  # a torn last line of a crashed writer
            if not isinstance(change, dict):
                continue  # JSON of another shape: the page must still render (it raised, stop 44)
            slim = {k: change.get(k) for k in ("at", "error", "commit", "fingerprint")}
            if change.get("applied"):
                applied = slim
            else:
                rejected = slim
    return {"last_applied": applied, "last_rejected": rejected}


def _series_json(series: list[Any]) -> dict[str, list[list[float]]]:
    return {s.name: [list(p) for p in s.points] for s in series}


def _usd(v: float) -> str:
    return f"${v:,.4f}" if abs(v) < 1 else f"${v:,.2f}"


def report(reader: PlatformReader, since: float, now: float) -> View:
    """The offline weekly-review report (`switchyard report`): every team's traffic and
    month-to-date spend, and the operator's GPU view when the scheduler is reachable."""
    records = reader.request_records(None, since)
    window = figures.Window.covering(figures.first_time(since, (r.time for r in records)), now)
    teams = sorted({r.team for r in records})
    per_team = {team: figures.traffic_counts(r for r in records if r.team == team) for team in teams}
    requests_by_team = [
        Series(team, figures.traffic_series([r for r in records if r.team == team], window)[0].points) for team in teams
    ]
    first = month_start(now)
    spend = reader.spend(None, first)
    today = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    by_team: dict[str, float] = {}
    for row in spend["spend"]:
        by_team[row["team"]] = by_team.get(row["team"], 0.0) + float(row["usd"])
    spend_rows = [{**row, "flow": row["team"]} for row in spend["spend"]]  # summed per team, not flow
    by_day = figures.spend_by_day(spend_rows, figures.days_between(first, today))
    gpus = operator(reader, since, now)
    return View(
        "switchyard report",
        "report.html",
        {
            "since": since,
            "until": now,
            "traffic": per_team,
            "spend_by_team": dict(sorted(by_team.items())),
            "spend_since": first,
            "gpus": gpus.data,
        },
        {
            "requests": line_chart("Requests per bucket by team", requests_by_team, y_label="requests"),
            "requests_table": data_table("Requests per bucket by team", requests_by_team),
            "spend": line_chart("Spend per day by team (USD)", by_day, y_label="USD", y_format=_usd),
            "spend_table": data_table("Spend per day by team (USD)", by_day, y_format=_usd),
            **{f"gpu_{name}": chart for name, chart in gpus.charts.items()},
        },
    )


def render_standalone(view: View) -> str:
    """A view as one self-contained HTML page (the report's)."""
    return template_env().get_template(view.template).render(title=view.title, data=view.data, charts=view.charts)
