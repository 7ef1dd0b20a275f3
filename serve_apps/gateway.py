"""The gateway as a Ray Serve application: one FastAPI ingress deployment that runs the whole
request pipeline in its replica (no handle hop except the call to an in-cluster model).

    serve run serve_apps.gateway:build_app policies_dir=policies state_dir=.switchyard

Optional args: `checkpoints_dir` (local model checkpoints), `num_replicas`,
`app_name` (the Serve application name, for in-cluster providers; default `gateway`),
`local_model_gpus` / `local_model_max_replicas` (the local model on GPUs in the inference pool,
see `serve_apps.local_model.gpu_options`; with GPUs, a CPU replica of the same model,
`local-model-cpu`, is deployed beside it for flows that fall back to it when the pool is
saturated).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import ray
from fastapi import FastAPI, HTTPException, Request
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_apps.local_model import LocalModel, gpu_options
from switchyard.audit.gateway import gateway_audit_parts, gateway_audit_router
from switchyard.budgets.charge_journal import journal_name
from switchyard.budgets.http import spend_router
from switchyard.cluster.audit_metrics import SpoolBacklogGauge
from switchyard.cluster.gateway_metrics import RayGatewayMetrics
from switchyard.cluster.gateway_state import replica_state
from switchyard.cluster.ledger import gateway_budget_gate, gateway_charges_on_host, gateway_spend_source, replica_holder
from switchyard.cluster.serve_handle import in_cluster_factory
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.embeddings import EmbeddingsPipeline
from switchyard.gateway.eval_signing import EvalSigner
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.host_recovery import HostRecovery
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency_sql import SqlIdempotencyStore
from switchyard.gateway.metrics import FanOutMetrics, InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.runtime import Refresher, Sources
from switchyard.gateway.stage_timing import stage_timing_from_env
from switchyard.gateway.tracing import GatewayTracing
from switchyard.policy.keys import KeyStore, Principal

log = logging.getLogger(__name__)


def _bearer_principal(keys: KeySnapshot) -> Callable[[Request], Principal]:
    """Who calls an admin endpoint: any valid key (roles are checked by the endpoint itself;
    auditors may read audit and spend though they may not call the gateway)."""

    def authenticate(request: Request) -> Principal:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        who = keys.verifier.verify(key.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            raise HTTPException(401, "Authorization: Bearer <key> is missing, unknown or revoked")
        return who

    return authenticate


@serve.deployment(name="gateway", num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
@serve.ingress()
class Gateway:
    def __init__(
        self,
        policies_dir: str,
        state_dir: str,
        local_model: DeploymentHandle | None = None,
        app_name: str = "gateway",
        local_model_cpu: DeploymentHandle | None = None,
    ) -> None:
        replica = serve.get_replica_context().replica_id.unique_id
        node = ray.get_runtime_context().get_node_id()
        # This node's own state directory (spool, journals, policy copies; the shared stores are
        # the head's: the same SQLite files on one host, else `SWITCHYARD_DATABASE_URL`) and the
        # set the head published (never this node's files), after the layout checks: a replica
        # that fails them or gets no set raises here, and Serve never routes to it.
        state, policies = replica_state(policies_dir, state_dir, replica)
        self.sources = Sources(policies, KeyStore.in_state_dir(state))
        # Money and audit are never best-effort: the shared ledger and the durable audit store,
        # or the replica does not start. The spool is named after the charge journal, so a
        # dead replica's streams are recorded at what the ledger charged them.
        holder = replica_holder()
        self.audit, redactor = gateway_audit_parts(
            policies, state, SpoolBacklogGauge(replica).set, journal_name(holder), gateway_charges_on_host(state)
        )
        audit = self.audit
        # End users are named by their audit pseudonym in the ledger and the idempotency store
        # too, so erasing a subject unlinks all three.
        pseudonym = audit.builder.keyring.pseudonym_for
        self.budget = budget = gateway_budget_gate(policies, state, pseudonym, holder)
        # What dead replicas on this host left: sent on at startup, then looked for again
        # while this replica lives (before their holds expire; after a ledger outage).
        self.recovery = HostRecovery(budget, audit)
        self.local_metrics = InMemoryMetrics()
        metrics = FanOutMetrics(self.local_metrics, RayGatewayMetrics())
        keys = self.sources.key_snapshot()
        handles = (("local-model", local_model), ("local-model-cpu", local_model_cpu))
        bound = {name: handle for name, handle in handles if handle is not None}
        self.parts = GatewayParts(
            policies=lambda: self.sources.policies.current,
            keys=keys,
            providers=ProviderPool(in_cluster=in_cluster_factory(app_name, bound)),
            budget=budget,
            redactor=redactor,
            audit=audit,
            metrics=metrics,
            idempotency=SqlIdempotencyStore.in_state_dir(state),  # durable, shared by every replica
            circuits=CircuitBoard(on_change=lambda p, s: metrics.circuit_changed(p, s.value)),
            pseudonym=pseudonym,
            evals=EvalBook(EvalSigner.in_state_dir(state)),
            # OTLP export when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set (runtime_env env_vars).
            tracing=GatewayTracing.from_env(os.environ),
            stage_timing=stage_timing_from_env(os.environ),  # SWITCHYARD_SERVER_TIMING=stages: benchmark runs
        )
        self.pipeline = ChatPipeline(self.parts)
        self.embeddings = EmbeddingsPipeline(self.parts)  # in-cluster models through the chat pool's handles
        self.refresher = Refresher(self.sources, keys, observe=metrics.config_refresh)
        self.whoami = {"replica": replica, "node": node}  # in the health detail: which replica answered
        self.routers = [
            gateway_audit_router(policies, state, lambda key: keys.verifier.verify(key)),
            spend_router(lambda: gateway_spend_source(state), _bearer_principal(keys)),
        ]
        self._refresh_task: asyncio.Task[None] | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(
            lambda: self.pipeline,
            routers=self.routers,
            lifespan=self._lifespan,
            policy_state=lambda: {**self.refresher.state(), **self.whoami},
            embeddings=lambda: self.embeddings,
        )

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # Charges a killed replica on this host journaled but never sent reach the ledger first;
        # then its audit spool, whose cut-off streams are recorded at those charges.
        await self.recovery.recover()
        self.recovery.start()
        self._refresh_task = asyncio.get_running_loop().create_task(self.refresher.run())
        yield
        self._refresh_task.cancel()
        await self.recovery.stop()
        await self.pipeline.drain()  # streams whose clients left are still settling and auditing
        await self.pipeline.aclose()
        await self.embeddings.aclose()  # drains its settle-and-audit work first
        self.parts.tracing.shutdown()  # export what is buffered
        # Send queued charges and return budget slices now rather than letting them expire;
        # commit what the audit spool has acknowledged.
        await self.budget.aclose()
        await self.audit.close()
        await self.parts.providers.aclose()

    def check_health(self) -> None:
        # The loop never ends by itself (every failure is caught, logged and shown as degraded);
        # if it did, the replica would serve stale keys, so Serve replaces it.
        if self._refresh_task is not None and self._refresh_task.done():
            raise RuntimeError("the policy/key refresh loop stopped")


def build_app(args: dict[str, str]) -> serve.Application:
    app_name = args.get("app_name", "gateway")
    on_gpus = gpu_options(args)
    local = LocalModel.options(**on_gpus).bind(args.get("checkpoints_dir"))  # type: ignore[attr-defined]
    cpu = (
        LocalModel.options(name="local-model-cpu").bind(args.get("checkpoints_dir"))  # type: ignore[attr-defined]
        if on_gpus
        else None
    )
    gateway = Gateway.options(num_replicas=int(args.get("num_replicas", "1")))  # type: ignore[attr-defined]
    return gateway.bind(args["policies_dir"], args["state_dir"], local, app_name, cpu)
