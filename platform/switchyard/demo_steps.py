"""The demo's individual steps, each a real client of one part of the running platform: the
gateway through the OpenAI SDK, and the cluster through Ray (the scheduler actor's event log,
Serve's status) the way `switchyard status` reads them."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import openai


def call_gateway(
    gateway_url: str, api_key: str, flow: str = "chat", text: str = "Say hello to the platform."
) -> dict[str, Any]:
    """One chat completion through the gateway with the official OpenAI SDK, as a team would."""
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=api_key, max_retries=0, timeout=120)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": text}],
            max_tokens=32,
            extra_headers={"X-Switchyard-Flow": flow},
        )
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body) if isinstance(body, dict) else {}
        return {
            "status": exc.status_code,
            "code": error.get("code"),
            "summary": f"{error.get('code')}: {error.get('message')}",
        }
    completion = raw.parse()
    text = completion.choices[0].message.content or ""
    return {
        "status": raw.http_response.status_code,
        "summary": repr(text[:60]),
        "provider": raw.headers.get("x-switchyard-provider"),
        "model": raw.headers.get("x-switchyard-model"),
        "fallback": raw.headers.get("x-switchyard-fallback"),
    }


@dataclass
class Burst:
    """Concurrent chat traffic from `clients` threads until `stop()`: what Serve autoscales on."""

    gateway_url: str
    api_key: str
    clients: int
    statuses: Counter[int] = field(default_factory=Counter)
    providers: Counter[str] = field(default_factory=Counter)
    fallbacks: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for n in range(self.clients):
            t = threading.Thread(target=self._client, args=(n,), name=f"demo-burst-{n}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def _client(self, n: int) -> None:
        import httpx

        headers = {"authorization": f"Bearer {self.api_key}", "x-switchyard-flow": "assist"}
        with httpx.Client(base_url=self.gateway_url, timeout=120) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                body = {
                    "model": "auto",
                    "messages": [{"role": "user", "content": f"Client {n}, question {i}: tell me about GPUs."}],
                    "max_tokens": 48,
                }
                try:
                    r = http.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.TransportError:
                    status, provider, fallback = 599, None, None  # counted, not retried: the demo reports it
                else:
                    status = r.status_code
                    provider = r.headers.get("x-switchyard-provider")
                    fallback = r.headers.get("x-switchyard-fallback")
                with self._lock:
                    self.statuses[status] += 1
                    if provider:
                        self.providers[provider] += 1
                    if fallback and fallback != "none":
                        self.fallbacks.append(fallback)


class ClusterProbe:
    """A Ray driver attached to the platform's cluster: reads the scheduler and Serve."""

    def __init__(self, ray_address: str) -> None:
        from switchyard.cluster.head import PLATFORM_ENV

        os.environ.update(PLATFORM_ENV)
        import ray

        from switchyard.cluster.record import NAMESPACE
        from switchyard.cluster.scheduler_client import RetryPolicy, platform_scheduler

        ray.init(address=ray_address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
        self._ray = ray
        self.scheduler = platform_scheduler(RetryPolicy(call_timeout_s=60))

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        return self.scheduler.events(workload_id)

    def status(self) -> dict[str, Any]:
        return self.scheduler.status()

    def serve_replicas(self, app: str = "gateway", deployment: str = "local-model") -> int:
        """Running replicas of a deployment, as Serve's controller reports them."""
        from ray import serve

        status = serve.status().applications.get(app)
        if status is None or deployment not in status.deployments:
            return 0
        return int(status.deployments[deployment].replica_states.get("RUNNING", 0))

    def close(self) -> None:
        self._ray.shutdown()


def wait_until(what: str, predicate: Any, timeout_s: float, every_s: float = 1.0) -> Any:
    """Poll `predicate` until it returns something truthy; a clear error names what never came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise RuntimeError(f"{what} did not happen within {timeout_s:.0f}s")
