"""One simulation run end to end: inputs -> policy -> replay -> report (the `switchyard sim` core)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from switchyard.scheduler.core.config import SchedulerFile, load_policy_file
from switchyard.scheduler.core.policy import (
    DEFAULT_PRIORITY_CLASSES,
    PolicyKnobs,
    PreemptionMode,
    Quota,
    SchedulerPolicy,
    Team,
)
from switchyard.scheduler.fairness import JobTimes, finish_time_fairness, percentile
from switchyard.scheduler.sim.baselines import PolicyName, classes_for, knobs_for
from switchyard.scheduler.sim.engine import Cluster, SimTrace, Simulation, SimWindow
from switchyard.scheduler.sim.inference import InferenceDemand, load_azure_profile, packaged_profile
from switchyard.scheduler.sim.metrics import ReportInputs, build_report
from switchyard.scheduler.sim.teams import (
    INFERENCE_TEAM,
    RESEARCH_CLASSES,
    philly_teams,
    read_vc_nodes,
)
from switchyard.scheduler.sim.trace import TraceJob, load_trace
from switchyard.scheduler.sim.trace_rows import MAX_JOB_GPUS
from switchyard.scheduler.sim.window import NAMED_WINDOWS, resolve_window, select_jobs

WINDOWS = NAMED_WINDOWS


@dataclass(frozen=True, slots=True)
class SimSpec:
    trace: Path
    gpus: int
    policy: PolicyName = PolicyName.SWITCHYARD
    window_from: str | None = None
    """A date or a fraction of the trace's span (sim.window); None: the trace's start."""
    window_to: str | None = None
    """A date or a fraction; None: just after the trace's last submit."""
    teams_file: Path | None = None
    policy_file: Path | None = None
    azure_file: Path | None = None
    inference: bool = True
    inference_peak_rps: float | None = None
    """Default: 0.25 requests/s per cluster GPU (about 5% of the GPUs at the daily peak)."""
    slo_bound_s: float = 300.0
    seed: int = 0
    anomaly: bool = True
    tail_days: float = 30.0
    max_jobs: int | None = None
    """Keep only the first N jobs submitted inside the window (test slices)."""
    knobs: PolicyKnobs | None = None
    """Overrides switchyard's knobs (from the policy file or defaults); used when tuning."""
    warmup_s: float | None = None
    """Replay jobs submitted this long before the window, unmeasured (sim.window.resolve_window)."""


@dataclass(slots=True)
class SimResult:
    report: dict[str, object]
    trace: SimTrace
    wall_s: float


def _switchyard_knobs(spec: SimSpec, file: SchedulerFile | None) -> PolicyKnobs:
    return spec.knobs or (file.to_policy().knobs if file else PolicyKnobs())


def _policy(spec: SimSpec, jobs: list[TraceJob], inference_gpus: int) -> tuple[SchedulerPolicy, int]:
    file: SchedulerFile | None = load_policy_file(spec.policy_file) if spec.policy_file else None
    switchyard_knobs = _switchyard_knobs(spec, file)
    classes = file.to_policy().priority_classes if file and file.priority_classes else DEFAULT_PRIORITY_CLASSES
    if file is not None and file.teams:
        teams = file.to_policy().teams
        missing = {j.team for j in jobs} - {t.name for t in teams}
        if missing:
            raise ValueError(f"{spec.policy_file}: teams {sorted(missing)} are in the trace but not in the file")
    else:
        teams_file = spec.teams_file or spec.trace.parent / "philly_vc_nodes.csv"
        if spec.teams_file is None and not teams_file.exists():
            raise ValueError(
                f"{spec.trace}: no team guarantees to replay it with: give --policy-file (a scheduler.yaml "
                f"with teams:) or --teams (a CSV of vc,node num); the default, {teams_file}, does not exist"
            )
        research = max(0, spec.gpus - inference_gpus)
        teams = philly_teams(read_vc_nodes(teams_file), {j.team for j in jobs}, research, inference_gpus)
    knobs = knobs_for(spec.policy, switchyard_knobs)
    # GPU types and cohorts come with the file's teams (its quotas name the types).
    typed = file.to_policy() if file is not None and file.teams else None
    gpu_types = typed.gpu_types if typed else ()
    cohorts = typed.cohorts if typed else ()
    policy = SchedulerPolicy(classes_for(spec.policy, classes), teams, knobs, gpu_types, cohorts)
    unknown = [j for j in jobs if gpu_types and j.gpu_type and j.gpu_type not in gpu_types]
    if unknown:
        raise ValueError(
            f"{spec.trace}: job {unknown[0].workload_id} asks for GPU type {unknown[0].gpu_type!r}, "
            f"not one of the policy's {list(gpu_types)}"
        )
    known = {p.name for p in policy.priority_classes}
    strangers = [j for j in jobs if j.priority_class not in known]
    if strangers:
        raise ValueError(
            f"{spec.trace}: job {strangers[0].workload_id} has priority class {strangers[0].priority_class!r}, "
            f"not one of the policy's {sorted(known)}"
        )
    return policy, inference_gpus


def _check_spec(spec: SimSpec) -> None:
    """Numbers a run cannot mean, named as the CLI flag that sets them."""
    if spec.gpus <= 0:
        raise ValueError(f"--gpus must be positive, got {spec.gpus}")
    if spec.gpus > MAX_JOB_GPUS:  # one node object per 8 GPUs: 10^9 ran out of memory (stop 44)
        raise ValueError(f"--gpus must be at most {MAX_JOB_GPUS:,}, got {spec.gpus:,}")
    rps = spec.inference_peak_rps
    if rps is not None and not (math.isfinite(rps) and rps >= 0):
        raise ValueError(f"--inference-peak-rps must be a finite number >= 0, got {rps}")
    if not (math.isfinite(spec.slo_bound_s) and spec.slo_bound_s > 0):
        raise ValueError(f"--slo-bound-s must be a positive number of seconds, got {spec.slo_bound_s}")
    if spec.max_jobs is not None and spec.max_jobs < 0:
        raise ValueError(f"--max-jobs must be >= 0, got {spec.max_jobs}")


def run(spec: SimSpec) -> SimResult:
    _check_spec(spec)
    trace_in = load_trace(spec.trace, spec.seed)
    replay = resolve_window(trace_in, spec.window_from, spec.window_to, spec.warmup_s)
    window = SimWindow(replay.start_s, replay.end_s, spec.tail_days * 86400)
    jobs = select_jobs(trace_in.jobs, replay, spec.max_jobs)
    start_s = min([j.submit_s for j in jobs] + [window.start_s])
    demand = None
    inference_gpus = 0
    if spec.inference:
        profile = load_azure_profile(spec.azure_file) if spec.azure_file else packaged_profile()
        peak_rps = spec.inference_peak_rps if spec.inference_peak_rps is not None else 0.25 * spec.gpus
        demand = InferenceDemand(profile, peak_rps, spec.seed)
        inference_gpus = demand.peak(int(start_s // 60), int(window.end_s // 60) + 1)
    policy, inference_gpus = _policy(spec, jobs, inference_gpus)
    file = load_policy_file(spec.policy_file) if spec.policy_file else None
    began = time.perf_counter()
    cluster = Cluster(spec.gpus, gpu_types=policy.gpu_types)
    trace = Simulation(policy, cluster, jobs, window, demand, inversion_bound_s=spec.slo_bound_s).run()
    wall = time.perf_counter() - began
    offered = sum(j.gpus * j.duration_s for j in jobs if window.start_s <= j.submit_s < window.end_s)
    if demand is not None:
        offered += 60.0 * sum(demand.targets(int(window.start_s // 60), int(window.end_s // 60)))
    quotas = {t.name: t.guaranteed_gpus for t in policy.teams}
    report = build_report(ReportInputs(trace, quotas, spec.slo_bound_s, offered))
    report["policy"] = spec.policy.value
    report["window"] = {"from": spec.window_from, "to": spec.window_to}
    report["window_s"] = {
        "start": replay.start_s,
        "end": replay.end_s,
        "replayed_from": max(start_s, replay.replay_from_s),
    }
    report["trace_epoch"] = trace_in.epoch.isoformat()
    report["seed"] = spec.seed
    report["inference_guarantee_gpus"] = inference_gpus
    report["sim_wall_s"] = round(wall, 2)
    report["events_per_s"] = round(trace.events / wall) if wall > 0 else 0
    if spec.anomaly:
        _add_anomaly(report, jobs, window, quotas, spec, trace, private_knobs(_switchyard_knobs(spec, file)))
    return SimResult(report, trace, wall)


def private_cluster_gpus(quota: int, jobs: list[TraceJob], gpus_per_node: int = 8) -> int:
    largest = max((j.gpus for j in jobs), default=1)
    return gpus_per_node * math.ceil(max(quota, largest, 1) / gpus_per_node)


def private_knobs(shared: PolicyKnobs) -> PolicyKnobs:
    """The private-cluster baseline runs switchyard's own rules on the team's own GPUs: the
    same ordering, backfill, reservations and starvation aging (a 32-GPU gang on a 32-GPU
    cluster gets a reservation as it would on the shared one), with no quota to enforce and
    no one else to preempt. It used to be FIFO + backfill without reservations, which
    starved a private cluster's biggest gangs and flattered sharing (issue 18, finding 4)."""
    return replace(shared, enforce_quota=False, borrowing=False, preemption=PreemptionMode.NONE)


def run_private(team: str, jobs: list[TraceJob], gpus: int, window: SimWindow, knobs: PolicyKnobs) -> SimTrace:
    """`jobs` (one team's) alone on a private cluster of `gpus` GPUs, with `knobs`
    (`private_knobs` of the shared run's)."""
    policy = SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, (Team(team, (Quota(RESEARCH_CLASSES, gpus),)),), knobs)
    return Simulation(policy, Cluster(gpus), jobs, replace(window)).run()


def _add_anomaly(
    report: dict[str, object],
    jobs: list[TraceJob],
    window: SimWindow,
    quotas: dict[str, int],
    spec: SimSpec,
    shared: SimTrace,
    knobs: PolicyKnobs,
) -> None:
    """Each team on a private cluster of its guarantee (`private_cluster_gpus`): its p99 wait
    there, the sharing anomaly (shared p99 - private p99) and finish-time fairness (rho)."""
    teams = report["teams"]
    assert isinstance(teams, dict)
    mine_shared = {r.workload_id: JobTimes(r.submit_s, r.finish_s) for r in shared.jobs}
    at_most_1: list[float] = []
    for team, row in teams.items():
        mine = [j for j in jobs if j.team == team]
        gpus = private_cluster_gpus(quotas.get(team, 0), mine)
        private = run_private(team, mine, gpus, window, knobs)
        p99 = percentile([r.wait_s for r in private.jobs], 99)
        row["private_cluster_gpus"] = gpus
        row["wait_p99_private_s"] = round(p99, 1)
        row["sharing_anomaly_s"] = round(float(row["wait_p99_s"]) - p99, 1)
        ftf = finish_time_fairness(
            {r.workload_id: mine_shared[r.workload_id] for r in private.jobs if r.workload_id in mine_shared},
            {r.workload_id: JobTimes(r.submit_s, r.finish_s) for r in private.jobs},
            shared.end_s,
            private.end_s,
        )
        row["finish_time_fairness"] = ftf.as_dict()
        if ftf.jobs:
            at_most_1.append(ftf.share_rho_at_most_1)
    report["rho_at_most_1_worst_team"] = round(min(at_most_1, default=1.0), 4)


__all__ = ["INFERENCE_TEAM", "WINDOWS", "SimResult", "SimSpec", "run"]
