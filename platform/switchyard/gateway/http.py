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

from switchyard.gateway.embeddings import EmbeddingsPipeline
from switchyard.gateway.errors import GatewayError, Unauthenticated, internal_error, json_path
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.planning import DEADLINE_HEADER, FLOW_HEADER, IDEMPOTENCY_HEADER
from switchyard.gateway.request_body import read_capped_body
from switchyard.gateway.results import JSONResult, retry_headers
from switchyard.gateway.wire import ChatRequest
from switchyard.policy.keys import Principal
from switchyard.policy.roles import Action, allowed

log = logging.getLogger(__name__)
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
_LOCATIONS = frozenset({"body", "query", "header", "path", "cookie"})
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
    embeddings: Callable[[], EmbeddingsPipeline] | None = None,
) -> FastAPI:
    """`policy_state` (e.g. `PolicyStore.status`) adds the policy set in force, whether it is
    degraded and the last rejected change to the health detail, which `switchyard status` shows.
    `embeddings`: serves `POST /v1/embeddings` under the same keys, flows and budgets."""
    app = FastAPI(
        lifespan=lifespan,
        title="switchyard gateway",
        description="OpenAI-compatible chat completions with flows, prompt versions and explicit fallback.",
        version="1",
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = tuple(first.get("loc", ()))
        path = json_path(loc[1:] if loc and loc[0] in _LOCATIONS else loc)
        # Rebuilt from loc and msg only: FastAPI's default body echoes `input`.
        body = _error_body("invalid_request", f"{path}: {first.get('msg')}", path)
        return JSONResponse(status_code=400, content=body)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        body = _error_body(f"http_{exc.status_code}", str(exc.detail), None, kind)
        return JSONResponse(status_code=exc.status_code, content=body, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Only a bug gets here: logged with its traceback, answered in OpenAI's shape.
        log.exception("unhandled error on %s", request.url.path)
        bug = internal_error()
        return JSONResponse(status_code=bug.status, content=bug.body())

    @app.post(
        "/v1/chat/completions",
        summary="Create a chat completion (OpenAI-compatible; stream with `stream: true`)",
        openapi_extra=_chat_openapi(),
    )
    async def chat_completions(request: Request) -> Response:
        p = pipeline()
        caller = await _caller_and_body(p.parts, request)
        if isinstance(caller, JSONResponse):
            return caller
        result = await p.handle(caller[1], request.headers, caller[0])
        if isinstance(result, JSONResult):
            return JSONResponse(result.body, status_code=result.status, headers=result.headers)
        return StreamingResponse(
            result.body, status_code=result.status, headers=result.headers, media_type="text/event-stream"
        )

    if embeddings is not None:

        @app.post("/v1/embeddings", summary="Create embeddings (OpenAI-compatible; governed like chat)")
        async def create_embeddings(request: Request) -> Response:
            e = embeddings()
            caller = await _caller_and_body(e.parts, request)
            if isinstance(caller, JSONResponse):
                return caller
            result = await e.handle(caller[1], request.headers, caller[0])
            return JSONResponse(result.body, status_code=result.status, headers=result.headers)

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

    def detail(request: Request) -> dict[str, Any]:
        p = pipeline()
        policy = policy_state() if policy_state is not None else {"fingerprint": p.parts.policies().fingerprint}
        return {"policy": policy, **p.status()}

    @app.get(
        "/healthz",
        summary="Liveness and readiness; with an operator key, the policy state and provider circuits too",
    )
    async def healthz(request: Request) -> dict[str, Any]:
        # Without a key: nothing about teams, files or errors (it is reachable by anyone).
        answer: dict[str, Any] = {"live": True, "ready": True}
        if request.headers.get("authorization") is not None and _operator(pipeline(), request) is None:
            answer.update(detail(request))
        return answer

    @app.get("/v1/switchyard/status", summary="Policy state, circuits, fallbacks and sheds (operator key)")
    async def status(request: Request) -> JSONResponse:
        refused = _operator(pipeline(), request)
        if refused is not None:
            return JSONResponse(refused.body(), status_code=refused.status)
        # Counts and states only: no request content, no credentials.
        return JSONResponse(detail(request))

    for router in routers:
        app.include_router(router)
    _add_request_schemas(app)
    return app


async def _caller_and_body(parts: GatewayParts, request: Request) -> tuple[Principal, bytes] | JSONResponse:
    """Who calls, from the headers alone (an unauthenticated body is never read), then the body,
    refused by its Content-Length or cut off while streaming in past the limit."""
    try:
        who = parts.keys.authenticate(request.headers)
        raw = await read_capped_body(request, parts.policies().org.gateway.limits.max_body_bytes)
    except GatewayError as exc:
        parts.metrics.request("unknown", "unknown", exc.status, None)
        return JSONResponse(exc.body(), status_code=exc.status, headers={**retry_headers(exc.status), **exc.headers})
    return who, raw


def _operator(p: ChatPipeline, request: Request) -> GatewayError | None:
    """None when the request carries a key that may operate the platform, else the error."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    who = p.parts.keys.verifier.verify(key.strip()) if scheme.lower() == "bearer" else None
    if who is None:
        return Unauthenticated("invalid_api_key", "send an operator key as `Authorization: Bearer <key>`")
    if not allowed(who, Action.OPERATE):
        return GatewayError(
            "role_not_allowed", f"key {who.key_id} (role {who.role.value}) may not read platform status", status=403
        )
    return None


def _error_body(code: str, message: str, param: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"type": kind, "code": code, "message": message, "param": param}}


def _chat_openapi() -> dict[str, Any]:
    """The chat route reads its raw body (to authenticate first, cap it and fingerprint it for
    idempotency), so FastAPI cannot infer its schema: it is declared from `ChatRequest`."""
    schema = ChatRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    headers = [
        (FLOW_HEADER, "The flow to run (default: the team's `default_flow`)", {"type": "string"}),
        (DEADLINE_HEADER, "Shortens (never extends) the flow's deadline, in ms", {"type": "integer"}),
        (IDEMPOTENCY_HEADER, "Retries with the same key and body replay the first answer", {"type": "string"}),
    ]
    return {
        "parameters": [
            {"name": name, "in": "header", "required": False, "description": text, "schema": sch}
            for name, text, sch in headers
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema, "example": CHAT_EXAMPLE}},
        },
    }


def _add_request_schemas(app: FastAPI) -> None:
    """Put `ChatRequest`'s nested models where `_chat_openapi`'s references point."""
    defs = ChatRequest.model_json_schema(ref_template="#/components/schemas/{model}").get("$defs", {})
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = generate()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
