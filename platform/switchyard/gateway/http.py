"""The gateway's HTTP surface as a FastAPI app: OpenAI-compatible routes over the pipeline.

No Ray here: the Serve deployment (`serve_apps/gateway.py`) returns this app from its
ingress builder, and tests mount it on a plain ASGI transport or uvicorn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchyard.gateway.errors import GatewayError
from switchyard.gateway.pipeline import ChatPipeline, JSONResult

log = logging.getLogger(__name__)
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
CHAT_EXAMPLE = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Where is my parcel?"}],
    "variables": {"product": "Acme Router"},
}


def create_app(
    pipeline: Callable[[], ChatPipeline],
    routers: Iterable[APIRouter] = (),
    lifespan: Lifespan | None = None,
    policy_state: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """`policy_state` (e.g. `PolicyStore.status`) adds the policy set in force and the last
    rejected change to `/healthz`, which `switchyard status` shows."""
    app = FastAPI(
        lifespan=lifespan,
        title="switchyard gateway",
        description="OpenAI-compatible chat completions with flows, prompt versions and explicit fallback.",
        version="1",
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        # Rebuilt from loc and msg only: FastAPI's default body echoes `input`.
        return JSONResponse(
            status_code=400,
            content={
                "error": {
                    "type": "invalid_request_error",
                    "code": "invalid_request",
                    "message": f"{loc}: {first.get('msg')}",
                    "param": loc,
                }
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content={
                "error": {
                    "type": "invalid_request_error",
                    "code": f"http_{exc.status_code}",
                    "message": str(exc.detail),
                    "param": None,
                }
            },
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Only a bug gets here: logged with its traceback, answered in OpenAI's shape.
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(
            status_code=500,
            content={
                "error": {"type": "api_error", "code": "internal_error", "message": "internal error", "param": None}
            },
        )

    @app.post(
        "/v1/chat/completions",
        summary="Create a chat completion (OpenAI-compatible; stream with `stream: true`)",
        openapi_extra={"requestBody": {"content": {"application/json": {"example": CHAT_EXAMPLE}}, "required": True}},
    )
    async def chat_completions(request: Request) -> Response:
        result = await pipeline().handle(await request.body(), request.headers)
        if isinstance(result, JSONResult):
            return JSONResponse(result.body, status_code=result.status, headers=result.headers)
        return StreamingResponse(
            result.body, status_code=result.status, headers=result.headers, media_type="text/event-stream"
        )

    @app.get("/v1/models", summary="Models the calling team's flows may use")
    async def models(request: Request) -> JSONResponse:
        p = pipeline()
        try:
            principal = p.parts.keys.authenticate(request.headers)
        except GatewayError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        ps = p.parts.policies()
        team = ps.teams.get(principal.team)
        names: set[str] = set()
        for flow_name in team.flows if team is not None else {}:
            flow = p.planner.flows.get(ps, principal.team, flow_name)
            names |= {flow.model, *flow.allowed_models}
        data: list[dict[str, Any]] = [{"id": "auto", "object": "model", "created": 0, "owned_by": "switchyard"}]
        data += [
            {"id": n, "object": "model", "created": 0, "owned_by": ps.providers.models[n].provider}
            for n in sorted(names)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/healthz", summary="Liveness, the policy set in force and provider circuits")
    async def healthz() -> dict[str, Any]:
        p = pipeline()
        policy = policy_state() if policy_state is not None else {"fingerprint": p.parts.policies().fingerprint}
        return {"ok": True, "policy": policy, **p.status()}

    @app.get("/v1/switchyard/status", summary="Circuits, fallbacks and skipped candidates per provider")
    async def status() -> dict[str, Any]:
        # Counts and states only: no request content, no credentials.
        return pipeline().status()

    for router in routers:
        app.include_router(router)
    return app
