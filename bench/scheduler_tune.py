"""Tune switchyard's knobs on September only (October is the reported month).

September's offered load at 672 GPUs is only ~0.5, so tuning runs at the capacity that gives
September the evaluation load of ~0.9 (--gpus 360 by default), with Philly's teams sized for
it. Every row starts from the policy file's knobs and priority classes (the shipped
`bench/philly_scheduler.yaml`) and changes one knob (`--vary knob=v1,v2`, repeatable; `none`
for an optional knob turned off), so each row reads as "the shipped policy, but ...". Each
row is the mean [min, max] over the seeds.

    .venv/bin/python bench/scheduler_tune.py --seeds 0,1,2 \\
        --vary max_preemption_attempts=2,4,8 --vary max_reservations=0,2 --baselines
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from sim_inputs import TRACE, add_run_arguments, for_size

from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.core.policy import PolicyKnobs
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

COLUMNS = (
    "worst_team_wait_p99_s",
    "utilization",
    "inference_slo_attainment",
    "preemptions",
    "max_preemptions_per_job",
    "lost_gpu_hours",
    "jain_hourly_mean",
)


def parse_variation(text: str) -> tuple[str, list[object]]:
    """`knob=v1,v2` -> the knob and its values, typed as the knob's default is."""
    name, _, values = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(PolicyKnobs)}
    if name not in fields or not values:
        raise SystemExit(f"--vary {text!r}: expected knob=v1,v2 with a knob of {sorted(fields)}")
    default = fields[name].default
    kind = type(default) if default is not None else float
    parsed: list[object] = []
    for value in values.split(","):
        if value == "none":
            parsed.append(None)
        elif kind is bool:
            parsed.append(value.lower() in ("1", "true", "on", "yes"))
        else:
            parsed.append(kind(value))
    return name, parsed


def spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    digits = 4 if max(abs(v) for v in values) < 10 else 0
    return f"{mean:.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def row(label: str, reports: list[dict[str, object]]) -> str:
    cells = [spread([float(r[c]) for r in reports]) for c in COLUMNS]  # type: ignore[arg-type]
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, gpus=360, window="sep", size_teams=True)
    parser.add_argument("--vary", action="append", default=[], help="knob=v1,v2 (repeatable)")
    parser.add_argument("--baselines", action="store_true", help="also run the baselines")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variations = [parse_variation(v) for v in args.vary]
    frm, to = WINDOWS[args.window]
    shipped = load_policy_file(args.policy_file).to_policy().knobs
    print(f"{args.window} at {args.gpus} GPUs; mean [min, max] over seeds {args.seeds}\n")
    print("| setting | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    with for_size(args.policy_file, args.size_teams) as policy_file:

        def reports(policy: PolicyName, knobs: PolicyKnobs | None) -> list[dict[str, object]]:
            return [
                run(
                    SimSpec(
                        TRACE,
                        args.gpus,
                        policy,
                        frm,
                        to,
                        policy_file=policy_file,
                        anomaly=False,
                        seed=seed,
                        knobs=knobs,
                    )
                ).report
                for seed in seeds
            ]

        print(row("**shipped**", reports(PolicyName.SWITCHYARD, None)), flush=True)
        for name, values in variations:
            for value in values:
                knobs = dataclasses.replace(shipped, **{name: value})
                print(row(f"{name} = {value}", reports(PolicyName.SWITCHYARD, knobs)), flush=True)
        for policy in PolicyName:
            if args.baselines and policy is not PolicyName.SWITCHYARD:
                print(row(f"baseline {policy.value}", reports(policy, None)), flush=True)
    varied = "".join(f" --vary {v}" for v in args.vary)
    flags = (" --baselines" if args.baselines else "") + ("" if args.size_teams else " --no-size-teams")
    print(
        f"\nreproduce: .venv/bin/python bench/scheduler_tune.py --gpus {args.gpus} --window {args.window} "
        f"--seeds {args.seeds} --policy-file {args.policy_file}{varied}{flags}"
    )


if __name__ == "__main__":
    main()
