"""`--plot`: wait-time CDFs per team and utilisation over time, one PNG (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from switchyard.scheduler.sim.engine import SimTrace


def write_plot(trace: SimTrace, path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    fig, (cdf, util) = plt.subplots(1, 2, figsize=(13, 5))
    by_team: dict[str, list[float]] = {}
    for record in trace.jobs:
        by_team.setdefault(record.team, []).append(max(record.wait_s, 1.0))
    for team, waits in sorted(by_team.items()):
        waits.sort()
        cdf.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], label=team)
    cdf.set_xscale("log")
    cdf.set_xlabel("wait (s, log)")
    cdf.set_ylabel("fraction of jobs")
    cdf.set_title("wait CDF per team")
    cdf.legend(fontsize="small")
    hours = list(range(len(trace.hourly_allocated)))
    util.plot([h / 24 for h in hours], [a / trace.capacity for a in trace.hourly_allocated])
    util.set_xlabel("day of window")
    util.set_ylabel("allocated / capacity")
    util.set_ylim(0, 1.05)
    util.set_title("utilisation (hourly)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
