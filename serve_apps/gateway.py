"""The gateway as a Ray Serve application (placeholder until the request pipeline lands).

`serve run serve_apps.gateway:build_app policies_dir=policies state_dir=.switchyard`
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from ray import serve

from switchyard.policy.store import PolicyStore

app = FastAPI(title="switchyard gateway")


@serve.deployment(name="gateway", num_replicas=1)
@serve.ingress(app)
class Gateway:
    def __init__(self, policies_dir: str, state_dir: str) -> None:
        self.policies = PolicyStore(policies_dir)

    @app.get("/healthz")
    def healthz(self) -> dict[str, Any]:
        return {"ok": True, "policy": self.policies.status()}

    @app.post("/v1/chat/completions")
    def chat(self) -> JSONResponse:
        return JSONResponse(
            status_code=503,
            content={
                "error": {
                    "type": "service_unavailable",
                    "code": "pipeline_not_installed",
                    "message": "the gateway request pipeline is not installed yet",
                    "param": None,
                }
            },
        )


def build_app(args: dict[str, str]) -> serve.Application:
    return Gateway.bind(args["policies_dir"], args["state_dir"])  # type: ignore[attr-defined]
