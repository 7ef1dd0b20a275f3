"""Which team owns a Serve app, how many GPU replicas its inference quota allows, and the check
of the Serve configs teams deploy their own apps with (`serve_apps/configs/<team>.yaml`).

A Serve app belongs to the team its name starts with: `<team>--<app>` (Serve app names are
free text, and the name is the one thing `serve deploy`, `serve.run` and the state API all
carry). The platform's own apps are listed in `PLATFORM_APPS`. A GPU deployment's replicas
count against its team's `inference` quota in `policies/scheduler.yaml`; they run at priority
`production-inference`, which is not preemptible and therefore never borrows, so a team's
replicas may hold at most its inference guarantee.

    python -m switchyard.cluster.serve_configs check serve_apps/configs/*.yaml
    python -m switchyard.cluster.serve_configs merge serve_apps/configs/*.yaml > apps.yaml && serve deploy apps.yaml

`serve deploy` is declarative over every app deployed with it: applying one team's file would
delete the other teams' apps, so the files are merged into one and deployed together.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from switchyard.cluster.grant_holds import serve_gpu_options
from switchyard.cluster.record import CONSOLE_APP, GATEWAY_APP
from switchyard.config_file import read_yaml
from switchyard.scheduler.core import SchedulerPolicy, WorkloadClass
from switchyard.scheduler.core.config import load_policy_file

TEAM_SEPARATOR = "--"
INFERENCE_PRIORITY = "production-inference"
PLATFORM_TEAM = "inference"
PLATFORM_APPS: Mapping[str, str] = MappingProxyType({GATEWAY_APP: PLATFORM_TEAM, CONSOLE_APP: PLATFORM_TEAM})
"""The platform's own Serve apps (the gateway and its local model, the console) and the team they count against."""


def app_team(app: str) -> str | None:
    """The team that owns Serve app `app`, or None when its name does not say."""
    if app in PLATFORM_APPS:
        return PLATFORM_APPS[app]
    team, sep, rest = app.partition(TEAM_SEPARATOR)
    return team if sep and team and rest else None


def inference_teams(policy: SchedulerPolicy) -> frozenset[str]:
    """Teams with an inference quota: the only ones whose Serve replicas may hold GPUs."""
    out = set()
    for team in policy.teams:
        try:
            team.quota_index(WorkloadClass.INFERENCE)
        except KeyError:
            continue
        out.add(team.name)
    return frozenset(out)


def inference_gpu_limit(policy: SchedulerPolicy, team: str, priority_class: str = INFERENCE_PRIORITY) -> int:
    """Most GPUs the team's Serve replicas may hold: its inference guarantee, plus its borrowing
    limit when replicas of `priority_class` may borrow (only preemptible work borrows, so
    production inference never does)."""
    try:
        owner = policy.team(team)
        quota = owner.quotas[owner.quota_index(WorkloadClass.INFERENCE)]
        priority = policy.priority(priority_class)
    except KeyError as err:
        raise ValueError(f"scheduler policy: {err.args[0]}") from None
    if not (policy.knobs.borrowing and priority.preemptible):
        return quota.guaranteed_gpus
    if quota.borrowing_limit_gpus is None:
        raise ValueError(f"team {team!r}: its inference quota has no borrowing limit, so replicas are unbounded")
    return quota.guaranteed_gpus + quota.borrowing_limit_gpus


def max_replicas(
    policy: SchedulerPolicy, team: str, gpus_per_replica: int, priority_class: str = INFERENCE_PRIORITY
) -> int:
    """A GPU deployment's max_replicas: the team's inference GPU limit over GPUs per replica."""
    if gpus_per_replica <= 0:
        raise ValueError(f"gpus_per_replica must be a positive whole number, got {gpus_per_replica}")
    limit = inference_gpu_limit(policy, team, priority_class)
    if limit < gpus_per_replica:
        raise ValueError(
            f"team {team!r}: its inference quota ({limit} GPUs) holds no replica of {gpus_per_replica} GPUs"
        )
    return limit // gpus_per_replica


def _deployment_gpus(source: str, app: str, deployment: Mapping[str, Any]) -> tuple[int, list[str]]:
    """GPUs a deployment may hold at most (max replicas x GPUs per replica), and what is wrong."""
    where = f"{source}: app {app!r} deployment {deployment.get('name')!r}"
    gpus = float((deployment.get("ray_actor_options") or {}).get("num_gpus", 0) or 0)
    if gpus <= 0:
        return 0, []
    if gpus != int(gpus):
        return 0, [f"{where}: num_gpus must be a whole number of GPUs for the scheduler, got {gpus}"]
    autoscaling = deployment.get("autoscaling_config")
    replicas = autoscaling.get("max_replicas") if isinstance(autoscaling, Mapping) else deployment.get("num_replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        return 0, [
            f"{where}: a GPU deployment states its replicas: num_replicas or autoscaling_config.max_replicas "
            f"(a whole number), got {replicas!r}"
        ]
    return replicas * int(gpus), []


def check_team_configs(configs: Mapping[str, Mapping[str, Any]], policy: SchedulerPolicy) -> list[str]:
    """Problems with teams' Serve configs (source -> parsed YAML): app names that name no team
    with an inference quota, a file holding another team's app, GPU deployments without a stated
    replica bound, and a team whose GPU replicas could exceed its inference quota."""
    problems: list[str] = []
    allowed = inference_teams(policy)
    gpus_by_team: dict[str, int] = {}
    for source, config in configs.items():
        file_team = Path(source).stem
        apps = config.get("applications")
        if not isinstance(apps, list) or not apps:
            problems.append(f"{source}: `applications` must be a non-empty list")
            continue
        for app in apps:
            name = str(app.get("name", ""))
            team = app_team(name)
            if team is None or name in PLATFORM_APPS:
                problems.append(f"{source}: app {name!r} must be named '<team>{TEAM_SEPARATOR}<app>'")
                continue
            if team != file_team:
                problems.append(f"{source}: app {name!r} belongs to team {team!r}, not to this file's {file_team!r}")
            if team not in allowed:
                problems.append(f"{source}: team {team!r} has no inference quota in scheduler.yaml")
                continue
            for deployment in app.get("deployments") or []:
                gpus, wrong = _deployment_gpus(source, name, deployment)
                problems.extend(wrong)
                gpus_by_team[team] = gpus_by_team.get(team, 0) + gpus
    for team, gpus in sorted(gpus_by_team.items()):
        limit = inference_gpu_limit(policy, team)
        if gpus > limit:
            problems.append(
                f"team {team!r}: its GPU deployments may hold {gpus} GPUs at max replicas; its inference "
                f"quota is {limit}"
            )
    return problems


def load_configs(paths: Sequence[str | Path]) -> dict[str, dict[str, Any]]:
    """Each file's parsed mapping, by path; `ConfigFileError` (a ValueError) naming the file and line."""
    return {str(path): read_yaml(path).data for path in paths}


def merge_team_configs(paths: Sequence[str | Path], policy: SchedulerPolicy) -> dict[str, Any]:
    """One `serve deploy` config holding every team's apps, after the quota check (ValueError
    listing every problem otherwise); every GPU deployment asks for its Serve slots
    (`grant_holds.serve_gpu_options`)."""
    configs = load_configs(paths)
    problems = check_team_configs(configs, policy)
    if problems:
        raise ValueError("\n".join(problems))
    apps = [app for config in configs.values() for app in config["applications"]]
    for app in apps:
        for deployment in app.get("deployments") or []:
            options = deployment.get("ray_actor_options") or {}
            gpus = int(float(options.get("num_gpus", 0) or 0))  # whole: checked above
            if gpus > 0:  # its Serve slots: it never lands on GPUs granted to a starting job
                deployment["ray_actor_options"] = serve_gpu_options(gpus, options)
    return {"applications": apps}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchyard.cluster.serve_configs")
    parser.add_argument("action", choices=("check", "merge"))
    parser.add_argument("configs", nargs="+", help="serve_apps/configs/<team>.yaml files")
    parser.add_argument("--policy", default="policies/scheduler.yaml")
    args = parser.parse_args(argv)
    try:
        policy = load_policy_file(args.policy).to_policy()
        merged = merge_team_configs(args.configs, policy)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    if args.action == "merge":
        print(yaml.safe_dump(merged, sort_keys=False), end="")
    else:
        print(f"ok: {len(merged['applications'])} apps within their teams' inference quotas")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
