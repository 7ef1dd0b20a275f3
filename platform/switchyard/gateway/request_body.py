"""Reading a request body with a size cap, before any of it is parsed.

A declared `Content-Length` over the cap is refused without reading a byte; a body sent
without one (chunked) is read until it passes the cap, then refused. Either way the replica
holds at most `max_bytes` (plus one chunk) of it.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from switchyard.gateway.errors import BadRequest, PayloadTooLarge


def too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge("request_too_large", f"request body is larger than the limit of {max_bytes} bytes")


async def read_capped_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isascii() or not declared.isdigit() or len(declared) > 19:
            raise BadRequest("invalid_content_length", "Content-Length must be a non-negative integer")
        if int(declared) > max_bytes:
            raise too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        # Nobody is left to read the answer; it is still counted like any refusal.
        raise BadRequest("client_disconnected", "the client closed the connection while sending the body") from None
    return b"".join(chunks)
