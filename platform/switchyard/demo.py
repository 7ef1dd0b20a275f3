"""The end-to-end story behind `switchyard demo` (and `make demo`).

One fresh local platform (8 logical GPUs, its own state directory, no API keys):

1. a training job (the tiny GPT, FSDP, 6 workers holding one GPU each) is submitted to the
   scheduler, admitted, launched through the Ray Jobs API, and checkpoints;
2. the local model (Serve, 1 GPU per replica, in the inference pool) serves that checkpoint
   through the gateway; a flow with a too-small budget is refused;
3. a burst of gateway traffic makes Serve scale the local model up; its pending replica makes
   the scheduler reclaim the GPUs training borrowed: a preemption notice, the job checkpoints
   and is requeued, the replica starts on the freed GPU; what the saturated pool cannot take
   falls back to the CPU replica, with the reason in a header;
4. the burst ends, Serve scales down, training is admitted again and resumes from its
   checkpoint;
5. the audit log holds a record of every request.

Every fact printed is read back from the platform (the scheduler's event log, Serve's status,
the audit log), so the story is visibly driven by the scheduler, not scripted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.paths import policies_dir, repo_root

TRAIN_CONFIG = "train_jobs/configs/demo-fsdp.yaml"
TRAIN_TEAM = "research"
LOCAL_MODEL_GPUS = 1


@dataclass(frozen=True)
class DemoKnobs:
    """How long each phase may take, and how hard the burst pushes (the test shortens nothing
    that the story needs; it only bounds the waits)."""

    burst_clients: int = 40
    burst_max_s: float = 180.0
    phase_timeout_s: float = 240.0


@dataclass
class DemoReport:
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str, **facts: Any) -> None:
        self.steps.append({"step": name, **facts})


def _switchyard(*args: str) -> Any:
    """Run a CLI command as a user would, and parse its --json output."""
    proc = subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args, "--json"], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`switchyard {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def run_demo(
    keep: bool = False, say: Callable[[str], None] = print, state: Path | None = None, knobs: DemoKnobs | None = None
) -> DemoReport:
    report = DemoReport()
    state = state or Path(tempfile.mkdtemp(prefix="switchyard-demo-"))
    knobs = knobs or DemoKnobs()
    started = time.monotonic()
    policies = policies_dir()
    check = _switchyard("policy", "check", str(policies))
    say(f" 1. policies: {check['teams']} teams, {check['flows']} flows, fingerprint {check['fingerprint'][:12]}")
    report.step("policy_check", **check)
    up = _switchyard("up", "--demo", "--detach", "--local-model-gpus", str(LOCAL_MODEL_GPUS), "--state-dir", str(state))
    say(
        f" 2. platform up in {time.monotonic() - started:.0f}s: 8 logical GPUs, gateway {up['gateway_url']}, "
        f"dashboard {up['dashboard_url']}, console {up['console_url']}"
    )
    report.step("up", gateway_url=up["gateway_url"], dashboard_url=up["dashboard_url"], console_url=up["console_url"])
    try:
        _Story(up, state, report, say, knobs).run()
    finally:
        if keep:
            say(f"--keep: still running; stop it with `switchyard down --state-dir {state}`")
        else:
            _switchyard("down", "--state-dir", str(state))
            say(f"12. platform down; the demo took {time.monotonic() - started:.0f}s")
            report.step("down")
    return report


class _Story:
    def __init__(
        self,
        up: dict[str, Any],
        state: Path,
        report: DemoReport,
        say: Callable[[str], None],
        knobs: DemoKnobs,
    ) -> None:
        self.up, self.state, self.report, self.say, self.knobs = up, state, report, say, knobs
        self.gateway, self.key = up["gateway_url"], up["demo_api_key"]
        self.checkpoints = state / "train" / "checkpoints"
        self.started_at = time.time()
        self.calls = 0  # gateway requests outside the burst

    def run(self) -> None:
        from switchyard.demo_steps import ClusterProbe

        probe = ClusterProbe(self.up["ray_address"])
        try:
            workload = self._train(probe)
            self._serve_checkpoint()
            self._budget_refusal()
            preempted_at = self._burst(probe, workload)
            self._resume(probe, workload, preempted_at)
            self._audit()
            self._status()
        finally:
            probe.close()

    # 3-4 ------------------------------------------------------------------------------------
    def _train(self, probe: Any) -> str:
        from switchyard.demo_steps import wait_until
        from switchyard.gateway.local_model import newest_checkpoint

        config = str(repo_root() / TRAIN_CONFIG)
        sub = _switchyard("train", "submit", config, "--team", TRAIN_TEAM, "--state-dir", str(self.state))
        workload = sub["workload_id"]
        admitted = wait_until(
            "the training job's admission",
            lambda: next((e for e in probe.events(workload) if e["kind"] == "admitted"), None),
            self.knobs.phase_timeout_s,
        )
        self.say(
            f" 3. training: {TRAIN_CONFIG} (FSDP, 6 workers x 1 GPU) submitted for team {TRAIN_TEAM!r} as "
            f"{workload}; admitted after {admitted.get('waited_s', 0):.1f}s and launched as a Ray job "
            "(dashboard: Jobs tab); research's guarantee is 2 GPUs, so 4 of its 6 are borrowed"
        )
        found = wait_until(
            "the training job's first checkpoint",
            lambda: newest_checkpoint(self.checkpoints),
            self.knobs.phase_timeout_s,
        )
        self.say(f" 4. training checkpointed: {found.name}")
        self.report.step("train_started", workload_id=workload, bundles=sub["bundles"], first_checkpoint=found.name)
        return str(workload)

    # 5-6 ------------------------------------------------------------------------------------
    def _serve_checkpoint(self) -> None:
        from switchyard.demo_steps import call_gateway, wait_until

        def served() -> dict[str, Any] | None:
            self.calls += 1
            chat = call_gateway(self.gateway, self.key)
            return chat if chat["status"] == 200 and "@step-" in (chat.get("model") or "") else None

        chat = wait_until("the local model serving the checkpoint", served, self.knobs.phase_timeout_s, every_s=2)
        self.say(
            f" 5. gateway chat as team 'demo': HTTP 200 from {chat['provider']}/{chat['model']} "
            f"(the training job's checkpoint): {chat['summary']}"
        )
        self.report.step("gateway_chat", **chat)

    def _budget_refusal(self) -> None:
        from switchyard.demo_steps import call_gateway

        self.calls += 1
        refused = call_gateway(self.gateway, self.key, flow="capped")
        self.say(f" 6. budget: flow demo/capped ($0.00001/day) -> HTTP {refused['status']}: {refused['summary']}")
        if refused["status"] != 402:
            raise RuntimeError(f"the capped flow was not refused by its budget: {refused}")
        self.report.step("budget_refusal", **refused)
        self.report.summary["budget"] = {"refused_status": refused["status"], "code": refused.get("code")}

    # 7-8 ------------------------------------------------------------------------------------
    def _burst(self, probe: Any, workload: str) -> float:
        from switchyard.cluster.serve_pool import reclaim_chains
        from switchyard.demo_steps import Burst

        burst = Burst(self.gateway, self.key, self.knobs.burst_clients)
        started = time.monotonic()
        burst.start()
        max_replicas, chain = 1, None
        try:
            while time.monotonic() - started < self.knobs.burst_max_s:
                max_replicas = max(max_replicas, probe.serve_replicas())
                chains = [c for c in reclaim_chains(probe.events()) if workload in c["victims"] and c["complete"]]
                if chains:
                    chain = chains[0]
                    break
                time.sleep(1.0)
        finally:
            burst.stop()
        leased = [r for r in probe.status()["serve_pool"]["leased"] if r["running"]]
        max_replicas = max(max_replicas, probe.serve_replicas(), len(leased))
        self.say(
            f" 7. burst: {burst.clients} clients, {burst.requests} requests in {time.monotonic() - started:.0f}s "
            f"(statuses {dict(burst.statuses)}); Serve scaled local-model to {max_replicas} replicas"
        )
        if chain is None:
            raise RuntimeError(
                f"no complete reclaim of the training job's GPUs within {self.knobs.burst_max_s:.0f}s of burst"
                f" (max replicas {max_replicas}); scheduler events: {probe.events()[-15:]}"
            )
        links = [self._link(step) for step in chain["steps"]]
        self.say(" 8. the scheduler reclaimed GPUs for Serve (cause chain):")
        for link in links:
            self.say(f"      {link['at_s']:6.1f}s  {link['what']}")
        reasons = sorted(set(burst.fallbacks))
        self.say(
            f"    fallbacks: {len(burst.fallbacks)} requests answered by the CPU replica"
            + (f" ({', '.join(reasons)})" if reasons else " (the GPU pool kept up)")
        )
        self.report.step("burst", requests=burst.requests, statuses=dict(burst.statuses), max_replicas=max_replicas)
        self.report.summary["serve"] = {
            "max_replicas": max_replicas,
            "replica_bound": self._replica_bound(),
        }
        self.report.summary["gateway"] = {
            "requests": burst.requests + self.calls,
            "statuses": {str(k): v for k, v in burst.statuses.items()},
            "providers": dict(burst.providers),
            "fallbacks": len(burst.fallbacks),
            "fallback_reasons": reasons,
        }
        self.report.summary["cause_chain"] = links
        preempted_at: float = next(s["at"] for s in chain["steps"] if s["kind"] == "preemption_notice")
        return preempted_at

    @staticmethod
    def _replica_bound() -> int:
        """What the platform set as the local model's max replicas: the inference quota."""
        from switchyard.cluster.deploy import local_model_args

        return int(local_model_args(policies_dir(), LOCAL_MODEL_GPUS)["local_model_max_replicas"])

    def _link(self, event: dict[str, Any]) -> dict[str, Any]:
        kind = event["kind"]
        what = {
            "replica_pending": f"Serve replica {event.get('replica', event['workload_id'])} pending: no free GPU",
            "reclaim_decision": "reclaim decision: preempt "
            + ", ".join(
                f"{v['workload_id']} ({v.get('lost_gpu_s', 0)} GPU-s since its checkpoint)"
                for v in event.get("victims", [])
            ),
            "preemption_notice": f"preemption notice to {event['workload_id']}: {event.get('reason')}",
            "requeued": f"{event['workload_id']} checkpointed, released its GPUs and was requeued",
            "stop_order": f"{event['workload_id']} ignored the notice and was stopped",
            "admitted": "the replica's GPU granted",
            "adopted": "the replica placed on the freed GPU and adopted",
            "replica_running": f"Serve replica running on node {str(event.get('node', '?'))[:8]}",
        }.get(kind, kind)
        return {
            "kind": kind,
            "workload_id": event["workload_id"],
            "at_s": round(event["at"] - self.started_at, 1),
            "what": what,
        }

    # 9-10 -----------------------------------------------------------------------------------
    def _resume(self, probe: Any, workload: str, preempted_at: float) -> None:
        from switchyard.demo_steps import wait_until

        resumed = wait_until(
            "the training job's resume after the burst",
            lambda: next(
                (e for e in probe.events(workload) if e["kind"] == "resumed" and e["at"] > preempted_at), None
            ),
            self.knobs.phase_timeout_s,
        )
        replicas = probe.serve_replicas()
        self.say(
            f" 9. the burst ended; Serve scaled back to {replicas} replica(s); the scheduler admitted the training "
            f"job again and it resumed from its checkpoint at step {resumed['step']}"
        )
        self.report.summary["train"] = {
            "workload_id": workload,
            "preempted": True,
            "resumed_from_step": resumed["step"],
            "resumed_from": resumed.get("checkpoint"),
        }
        self.report.summary["cause_chain"].append(
            {
                "kind": "resumed",
                "workload_id": workload,
                "at_s": round(resumed["at"] - self.started_at, 1),
                "what": f"{workload} resumed from its checkpoint at step {resumed['step']}",
            }
        )
        self.report.step("resumed", from_step=resumed["step"], serve_replicas=replicas)

    def _audit(self) -> None:
        expected = int(self.report.summary["gateway"]["requests"])

        def count() -> int:
            query = ("audit", "query", "--team", "demo", "--since", str(self.started_at - 5), "--limit", "1000000")
            return len(_switchyard(*query, "--state-dir", str(self.state)))

        # Medium-risk records are spooled and drained in the background: give the drain a moment.
        found, deadline = count(), time.monotonic() + 30
        while found < expected and time.monotonic() < deadline:
            time.sleep(2)
            found = count()
        verify = subprocess.run(
            [sys.executable, "-m", "switchyard.cli", "audit", "verify", "--state-dir", str(self.state)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.say(
            f"10. audit: {found} records for team demo's {expected} requests;"
            f" chain: {verify.stdout.strip() or verify.stderr.strip()}"
        )
        self.report.summary["audit"] = {"records": found, "chain_ok": verify.returncode == 0}

    def _status(self) -> None:
        status = _switchyard("status", "--state-dir", str(self.state))
        g = status["gpus"]
        if g["serve"] is None:  # the dashboard did not answer in time
            self.say(f"11. status: {g['total']:.0f} GPUs, {g['free']:.0f} free ({g['error']})")
        else:
            self.say(
                f"11. status: {g['total']:.0f} GPUs = {g['serve']:.0f} serve + {g['train']:.0f} train"
                f" + {g['free']:.0f} free"
            )
        self.report.step("status", gpus=g, serve_apps=sorted(status["serve"]))
        self.report.summary["status"] = {"gpus": g}
