"""Errors the gateway returns to a client, in OpenAI's error shape with honest status codes.

Messages name headers, fields, flows and providers; they never echo request content, so an
error body or log line cannot leak a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class GatewayError(Exception):
    """An error response: HTTP status, OpenAI `type`, a stable `code`, and a safe message."""

    status = 500
    type = "api_error"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.type, "code": self.code, "message": self.message, "param": self.param}}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthenticated(GatewayError):
    status = 401
    type = "authentication_error"


class PaymentRequired(GatewayError):
    status = 402
    type = "insufficient_quota"


class NotAllowed(GatewayError):
    status = 403
    type = "permission_error"


class IdempotencyConflict(GatewayError):
    status = 409
    type = "conflict_error"


class ContractViolation(GatewayError):
    status = 422
    type = "invalid_output_error"


class TooManyRequests(GatewayError):
    status = 429
    type = "rate_limit_error"


class ProviderFailure(GatewayError):
    """Every candidate failed (502) or none could be tried (503)."""

    status = 502
    type = "api_error"


class Unavailable(GatewayError):
    status = 503
    type = "service_unavailable"


class DeadlineExceeded(GatewayError):
    status = 504
    type = "timeout_error"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


def internal_error() -> GatewayError:
    """The answer to a bug in the gateway: 500 `api_error`, saying nothing of what broke."""
    return GatewayError("internal_error", "internal error")


def json_path(loc: Sequence[str | int]) -> str:
    """A field's location as a JSON path (`messages[0].content`), for `param` and messages."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"
