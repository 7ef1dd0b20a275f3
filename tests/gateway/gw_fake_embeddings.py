"""Fake embedding upstreams on 127.0.0.1: OpenAI's `POST /v1/embeddings` and Bedrock's
`invoke_model` for Titan Text Embeddings v2, in one server, each with its own state.

Each validates what it receives against the official request types (openai's
`EmbeddingCreateParams` through a pydantic TypeAdapter; botocore's InvokeModel input shape,
then Titan's body) and answers 400 when it is wrongly shaped, so an adapter that sends the
wrong shape fails its test. Vectors are deterministic (`fake_vector`: a hash of the text
seeds them), so a test can check the gateway returned exactly what the upstream made.
Faults are queued per upstream, one per request: status codes (with Retry-After or an AWS
error type), latency, malformed bodies, and answers without usage.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from botocore.validate import ParamValidator
from gw_fakes import OPENAI_KEY
from gw_server import ThreadedServer, request_body
from openai.types import EmbeddingCreateParams
from pydantic import TypeAdapter, ValidationError

_INVOKE = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("InvokeModel")
_OPENAI = TypeAdapter(EmbeddingCreateParams)
_OPENAI_KEYS = set(EmbeddingCreateParams.__annotations__)
_TITAN_KEYS = {"inputText", "dimensions", "normalize", "embeddingTypes"}
OPENAI_DIMENSIONS = 1536


def fake_vector(text: str, dimensions: int) -> list[float]:
    """The unit vector the fakes make for `text` (the same for both fakes)."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def fake_tokens(text: str) -> int:
    """What the fakes report as a text's tokens (~4 bytes per token, as English has)."""
    return max(1, math.ceil(len(text.encode()) / 4))


@dataclass
class Fault:
    kind: str  # status | latency | malformed | no_usage | wrong_count
    status: int = 500
    retry_after: str | None = None
    error_type: str | None = None  # Bedrock's x-amzn-errortype; OpenAI's error type/code
    delay_s: float = 0.0


@dataclass
class Upstream:
    faults: deque[Fault] = field(default_factory=deque)
    received: list[dict[str, Any]] = field(default_factory=list)  # what was valid and answered (or faulted)
    rejected: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.faults.clear()
        self.received.clear()
        self.rejected.clear()

    def next_fault(self) -> Fault | None:
        return self.faults.popleft() if self.faults else None


class FakeEmbeddingUpstreams:
    def __init__(self) -> None:
        self.openai = Upstream()
        self.bedrock = Upstream()
        self._server = ThreadedServer(self)

    @property
    def base(self) -> str:
        return self._server.url

    def reset(self) -> None:
        self.openai.reset()
        self.bedrock.reset()

    def start(self) -> None:
        self._server.__enter__()

    def stop(self) -> None:
        self._server.__exit__(None, None, None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = await request_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if path == "/v1/embeddings":
            await self._openai(headers, body, send)
        elif path.startswith("/model/") and path.endswith("/invoke"):
            model_id = urllib.parse.unquote(path[len("/model/") : -len("/invoke")])
            await self._titan(headers, model_id, body, send)
        else:
            await _json(send, 404, {"error": {"type": "not_found", "message": path}})

    # ------------------------------------------------------------ OpenAI

    async def _openai(self, headers: dict[str, str], body: bytes, send: Any) -> None:
        up = self.openai
        if headers.get("authorization") != f"Bearer {OPENAI_KEY}":
            up.rejected.append("bad credential")
            await _json(send, 401, {"error": {"type": "invalid_request_error", "code": "invalid_api_key"}})
            return
        req = _openai_request(up, body)
        if req is None:
            await _json(send, 400, {"error": {"type": "invalid_request_error", "code": "invalid_shape"}})
            return
        up.received.append(req)
        fault = up.next_fault()
        if fault is not None and fault.kind == "status":
            kind = fault.error_type or "server_error"
            extra = {"retry-after": fault.retry_after} if fault.retry_after else {}
            await _json(send, fault.status, {"error": {"type": kind, "code": kind, "message": "injected"}}, extra)
            return
        if fault is not None and fault.kind == "latency":
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.kind == "malformed":
            await _raw(send, 200, b'{"data": [ this is not json')
            return
        texts = [req["input"]] if isinstance(req["input"], str) else list(req["input"])
        if fault is not None and fault.kind == "wrong_count":
            texts = texts[:-1]
        dims = req.get("dimensions") or OPENAI_DIMENSIONS
        answer: dict[str, Any] = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": fake_vector(t, dims)} for i, t in enumerate(texts)
            ],
            "model": req["model"],
        }
        if fault is None or fault.kind != "no_usage":
            tokens = sum(fake_tokens(t) for t in texts)
            answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        await _json(send, 200, answer)

    # ------------------------------------------------------------ Bedrock (Titan v2)

    async def _titan(self, headers: dict[str, str], model_id: str, body: bytes, send: Any) -> None:
        up = self.bedrock
        if "AWS4-HMAC-SHA256" not in headers.get("authorization", ""):
            up.rejected.append("request is not SigV4-signed")
            await _json(send, 403, {"message": "missing signature"}, {"x-amzn-errortype": "AccessDeniedException"})
            return
        params: dict[str, Any] = {"modelId": model_id, "body": body}
        for name in ("contentType", "accept"):
            value = headers.get(_INVOKE.input_shape.members[name].serialization["name"].lower())
            if value is not None:
                params[name] = value
        problem = _titan_problem(params)
        if problem is not None:
            up.rejected.append(problem)
            await _json(send, 400, {"message": problem}, {"x-amzn-errortype": "ValidationException"})
            return
        titan = json.loads(body)
        up.received.append({"modelId": model_id, **titan})
        fault = up.next_fault()
        if fault is not None and fault.kind == "status":
            error_type = fault.error_type or (
                "ThrottlingException" if fault.status == 429 else "InternalServerException"
            )
            await _json(send, fault.status, {"message": "injected"}, {"x-amzn-errortype": error_type})
            return
        if fault is not None and fault.kind == "latency":
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.kind == "malformed":
            await _raw(send, 200, b'{"embedding": [ this is not json')
            return
        answer: dict[str, Any] = {"embedding": fake_vector(titan["inputText"], titan.get("dimensions", 1024))}
        if fault is None or fault.kind != "no_usage":
            answer["inputTextTokenCount"] = fake_tokens(titan["inputText"])
        await _json(send, 200, answer)


def _openai_request(up: Upstream, body: bytes) -> dict[str, Any] | None:
    try:
        req = json.loads(body)
        unknown = set(req) - _OPENAI_KEYS
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        validated = _OPENAI.validate_python(req)
        given = validated["input"]
        texts: list[object] = [given] if isinstance(given, str) else list(given)  # Iterables validate lazily
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise ValueError("input must be non-empty text (the gateway never sends token ids)")
        if req.get("encoding_format") != "float":
            raise ValueError("the gateway asks for floats")
    except (ValueError, ValidationError, KeyError, TypeError) as exc:
        up.rejected.append(f"{type(exc).__name__}: {str(exc)[:500]}")
        return None
    return req  # type: ignore[no-any-return]


def _titan_problem(params: dict[str, Any]) -> str | None:
    """Why an InvokeModel call is not a valid Titan Text Embeddings v2 request, or None."""
    report = ParamValidator().validate(params, _INVOKE.input_shape)
    if report.has_errors():
        return str(report.generate_report())
    if params.get("contentType") != "application/json":
        return "contentType must be application/json"
    try:
        titan = json.loads(params["body"])
    except ValueError:
        return "body is not JSON"
    if not isinstance(titan, dict) or set(titan) - _TITAN_KEYS:
        return f"unknown body fields {sorted(set(titan) - _TITAN_KEYS) if isinstance(titan, dict) else titan}"
    text = titan.get("inputText")
    if not isinstance(text, str) or not text:
        return "inputText must be a non-empty string"
    if titan.get("dimensions", 1024) not in (256, 512, 1024):
        return "dimensions must be 256, 512 or 1024"
    if not isinstance(titan.get("normalize", True), bool):
        return "normalize must be a boolean"
    return None


async def _json(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    await _raw(send, status, json.dumps(body).encode(), headers)


async def _raw(send: Any, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})
