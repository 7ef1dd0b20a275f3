"""AWS Bedrock's Converse API through boto3, run on the provider's own threads (boto3 is
synchronous: `providers.blocking_calls`).

`endpoint_url` (the provider's `base_url` in policy) points tests at a local server.

What each field of the gateway's OpenAI-format call becomes:
- system messages: top-level `system` text blocks (text only);
- user / assistant content: `text` blocks; `image_url` parts with a `data:` URL: `image`
  blocks (the decoded bytes and their format: png, jpeg, gif or webp). An `https:` URL is
  refused: Converse takes image bytes (or S3), never a URL. `detail` is not sent;
- assistant `tool_calls`: `toolUse` blocks (`input` is the parsed arguments JSON);
- `tool` messages: `toolResult` blocks in a user turn (consecutive turns of one role merge,
  as Converse requires user and assistant turns to alternate);
- `tools`: `toolConfig.tools[].toolSpec` (`name`, `description`, `inputSchema.json`,
  `strict`); `tool_choice` auto / required (`any`) / a named function (`tool`). Converse has
  no "none": the tools are left out, which is only possible while no message uses tools
  (Converse then needs `toolConfig`), so `none` with tool history is refused. Converse cannot
  limit a model to one call, so `parallel_tool_calls: false` with tools is refused;
- `output`: natively (`outputConfig.textFormat`, a `json_schema`) when the call asks for it
  natively with a schema; otherwise a system instruction asking for JSON only (with the
  schema when there is one), and the gateway's output contract checks the answer;
- `temperature` (capped at 1, Converse's range), `top_p`, `stop`, `max_tokens`:
  `inferenceConfig`.
Anything else it cannot translate is refused (`bad_request`, naming the field).

Answers: `toolUse` blocks become `ToolCall`s, stop reason `tool_use` finish `tool_calls`.
Streaming uses Converse (not ConverseStream): the text as one delta, then one
`ToolCallDelta` per call (whole arguments), then the finish. The fallback rules are the
same, and clients still receive a valid SSE stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from switchyard.gateway.messages import Message, uses_tools
from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import (
    Completion,
    Delta,
    OutputFormat,
    ProviderCall,
    ProviderError,
    ToolCall,
    ToolCallDelta,
)
from switchyard.gateway.providers.blocking_calls import MAX_CALLS, BlockingCalls, withdraw
from switchyard.gateway.providers.openai_format import (
    FunctionTool,
    cannot_honour,
    content_parts,
    function_tools,
    image_url,
    inline_image,
    json_instruction,
    past_tool_calls,
    text_only,
    tool_call_id,
    tool_choice,
    turn_role,
    wants_native_schema,
)
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}
_ERRORS = {
    "ThrottlingException": ErrorClass.RATE_LIMITED,
    "ServiceQuotaExceededException": ErrorClass.RATE_LIMITED,
    "ModelTimeoutException": ErrorClass.TIMEOUT,
    "InternalServerException": ErrorClass.SERVER_ERROR,
    "ServiceUnavailableException": ErrorClass.SERVER_ERROR,
    "ModelNotReadyException": ErrorClass.SERVER_ERROR,
    "ModelErrorException": ErrorClass.SERVER_ERROR,
    "AccessDeniedException": ErrorClass.SERVER_ERROR,
    "ResourceNotFoundException": ErrorClass.SERVER_ERROR,
}


def to_converse(name: str, call: ProviderCall) -> dict[str, Any]:
    """The Converse parameters for `call`; `name` (the provider's) is the one refusals use."""
    params: dict[str, Any] = {
        "modelId": call.model_version,
        "messages": _turns(name, call.messages),
        "inferenceConfig": _inference(name, call),
    }
    system = [
        {"text": text_only(name, f"messages[{i}].content", m)}
        for i, m in enumerate(call.messages)
        if m["role"] == "system"
    ]
    if call.output is not None and not wants_native_schema(call.output):
        system.append({"text": json_instruction(call.output)})
    if system:
        params["system"] = system
    tool_config = _tool_config(name, call)
    if tool_config is not None:
        params["toolConfig"] = tool_config
    if wants_native_schema(call.output):
        assert call.output is not None
        params["outputConfig"] = _native_output(call.output)
    return params


def _inference(name: str, call: ProviderCall) -> dict[str, Any]:
    inference: dict[str, Any] = {"maxTokens": call.max_tokens}
    if call.temperature is not None:
        if call.temperature > 1.0:  # refused, not capped: a silently cooler answer is a downgrade
            raise cannot_honour(name, "temperature", "Converse takes 0 to 1")
        inference["temperature"] = call.temperature
    if call.top_p is not None:
        inference["topP"] = call.top_p
    if call.stop:
        inference["stopSequences"] = call.stop
    return inference


def _native_output(output: OutputFormat) -> dict[str, Any]:
    # Converse carries the schema as a JSON text, not a document.
    schema = {"schema": json.dumps(output.schema), "name": output.name}
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": schema}}}


def _turns(name: str, messages: list[Message]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        api_role = turn_role(name, i, m)
        if api_role is None:
            continue
        blocks = _blocks(name, i, m)
        if turns and turns[-1]["role"] == api_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": api_role, "content": blocks})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"text": "(see instructions)"}]})
    return turns


def _blocks(name: str, i: int, m: Message) -> list[dict[str, Any]]:
    field = f"messages[{i}].content"
    if m["role"] == "tool":
        result = {"toolUseId": tool_call_id(name, i, m), "content": [{"text": text_only(name, field, m)}]}
        return [{"toolResult": result}]
    if m["role"] == "user":
        return [
            _user_block(name, f, part)
            for f, part in content_parts(name, field, m.get("content"), ("text", "image_url"))
        ]
    calls = past_tool_calls(name, i, m)
    texts = [{"text": p.get("text", "")} for _, p in content_parts(name, field, m.get("content"), ("text",))]
    if calls:
        texts = [t for t in texts if t["text"]]  # Converse refuses blank text blocks
    return texts + [{"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.arguments}} for c in calls]


def _user_block(name: str, field: str, part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"text": part.get("text", "")}
    url = image_url(name, field, part)
    if not url.startswith("data:"):
        raise cannot_honour(name, f"{field}.image_url.url", "Bedrock takes image bytes (a data: URL), not a URL")
    image = inline_image(name, f"{field}.image_url.url", url)
    return {"image": {"format": image.subtype, "source": {"bytes": image.raw()}}}


def _tool_config(name: str, call: ProviderCall) -> dict[str, Any] | None:
    choice = tool_choice(name, call.tool_choice)
    if not call.tools or (choice is not None and choice.mode == "none"):
        if uses_tools(call.messages):
            # Converse rejects toolUse/toolResult blocks without a toolConfig.
            field = "tool_choice" if call.tools else "tools"
            raise cannot_honour(name, field, "Converse needs the tools when the conversation uses them")
        if choice is not None and choice.mode in ("required", "named"):
            raise cannot_honour(name, "tool_choice", "it asks for a tool call but the request has no tools")
        return None  # no tools, or none: the model is simply not offered them
    if call.parallel_tool_calls is False:
        raise cannot_honour(name, "parallel_tool_calls", "Converse cannot limit a model to one tool call")
    config: dict[str, Any] = {"tools": [{"toolSpec": _tool_spec(t)} for t in function_tools(name, call.tools)]}
    if choice is not None:
        if choice.mode == "named":
            config["toolChoice"] = {"tool": {"name": choice.name}}
        else:
            config["toolChoice"] = {"any" if choice.mode == "required" else "auto": {}}
    return config


def _tool_spec(tool: FunctionTool) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name, "inputSchema": {"json": tool.parameters}}
    if tool.description:
        spec["description"] = tool.description
    if tool.strict is not None:
        spec["strict"] = tool.strict
    return spec


def bedrock_runtime_client(region: str | None, endpoint_url: str | None, timeout_s: float) -> Any:
    """One `bedrock-runtime` client per provider (chat and embeddings alike); `endpoint_url`
    points tests at a local server."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},  # the gateway retries, with its deadline
        connect_timeout=min(timeout_s, 10.0),
        read_timeout=timeout_s,
        max_pool_connections=MAX_CALLS,
    )
    return boto3.client("bedrock-runtime", region_name=region or "us-east-1", endpoint_url=endpoint_url, config=config)


class BedrockProvider:
    def __init__(
        self, name: str, region: str | None, endpoint_url: str | None, timeout_s: float, *, max_calls: int = MAX_CALLS
    ) -> None:
        self.name = name
        self._client = bedrock_runtime_client(region, endpoint_url, timeout_s)
        self._calls = BlockingCalls(name, max_calls)

    async def complete(self, call: ProviderCall) -> Completion:
        params = to_converse(self.name, call)
        job = self._calls.submit(self._client.converse, **params)
        try:
            resp = await asyncio.wait_for(asyncio.wrap_future(job), timeout=call.timeout_s)
        except TimeoutError:
            # A call that was sent goes on in its thread and may be answered (and billed):
            # charged at the bound. One still waiting for a thread is withdrawn: never sent.
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out", billed=withdraw(job)) from None
        except ClientError as exc:
            raise _client_error(self.name, exc) from None
        except ReadTimeoutError:  # sent whole: the model may finish, and bill, the answer
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out", billed=True) from None
        except ConnectTimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out") from None
        except EndpointConnectionError:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} connection failed") from None
        except BotoCoreError as exc:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} failed ({type(exc).__name__})") from None
        except (ResponseParserError, *answers.MALFORMED):
            # botocore could not parse a 200 into Converse's shape: an answer AWS may bill.
            raise answers.malformed(self.name) from None
        try:
            message = answers.obj(answers.obj(resp["output"], "output")["message"], "output.message")
            blocks = [answers.obj(b, "content[]") for b in answers.array(message["content"], "content")]
            text = "".join(answers.text(b.get("text"), "content[].text") for b in blocks)
            calls = tuple(_tool_call(answers.obj(b["toolUse"], "toolUse")) for b in blocks if "toolUse" in b)
            finish = answers.mapped_finish(resp.get("stopReason"), _FINISH, "stopReason")
        except answers.MALFORMED:
            raise answers.malformed(self.name) from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTER, f"{self.name} filtered the answer")
        usage = _usage(resp.get("usage"))
        return Completion(
            text, usage or Usage(0, 0), finish, call.model_version, usage_reported=usage is not None, tool_calls=calls
        )

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        done = await self.complete(call)
        if done.text:
            yield Delta(text=done.text)
        for index, tc in enumerate(done.tool_calls):
            yield Delta(tool_calls=(ToolCallDelta(index, id=tc.id, name=tc.name, arguments=tc.arguments),))
        yield Delta(finish_reason=done.finish_reason, usage=done.usage)

    async def aclose(self) -> None:
        self._calls.close()
        self._client.close()


def _tool_call(block: dict[str, Any]) -> ToolCall:
    call_id, name, arguments = block["toolUseId"], block["name"], block["input"]
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise answers.Malformed("a toolUse block's id or name is not a string")
    return ToolCall(call_id, name, json.dumps(arguments))


def _usage(u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    read, written = u.get("cacheReadInputTokens"), u.get("cacheWriteInputTokens")
    return answers.uncached_usage(u.get("inputTokens"), u.get("outputTokens"), read, written)


def _client_error(name: str, exc: ClientError) -> ProviderError:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    error_class = _ERRORS.get(code)
    if error_class is None:
        message = str(err.get("Message", "")).lower()
        if code == "ValidationException" and ("too long" in message or "context" in message):
            error_class = ErrorClass.CONTEXT_LENGTH
        elif status >= 500:
            error_class = ErrorClass.SERVER_ERROR
        else:
            error_class = ErrorClass.BAD_REQUEST
    return ProviderError(error_class, f"{name} answered {code or 'an error'} (HTTP {status})", status=status)
