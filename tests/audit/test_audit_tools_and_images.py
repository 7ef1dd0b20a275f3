"""Tool calls and images under the data policy: tool arguments and results are redacted as
prompts are, an answer's tool calls are stored with it, and images are kept by digest."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from _audit_helpers import EMAIL, PHONE, make_exchange

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.subject_keys import SubjectKeyring, unseal
from switchyard.policy.models import DataPolicies

PNG = (  # a 1x1 PNG
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "send_mail", "arguments": json.dumps({"to": EMAIL})}}
TOOL_TURNS = [
    {"role": "user", "content": "Mail my order status."},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": f"sent; they may call {PHONE}"},
]


def test_tool_arguments_and_results_are_redacted_and_restored(
    data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    redactor = PresidioRedactor(data_policies, scrubber)
    out = redactor.redact(TOOL_TURNS, "personal")
    sent = json.dumps(out.messages)
    assert EMAIL not in sent and PHONE not in sent
    assert json.loads(out.messages[1]["tool_calls"][0]["function"]["arguments"]) == {"to": "<EMAIL_ADDRESS_1>"}
    assert out.messages[1]["tool_calls"][0]["id"] == "call_1"  # the client's identifiers pass as sent
    assert out.messages[2]["content"] == "sent; they may call <PHONE_NUMBER_1>"
    assert out.summary.entity_counts == {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}
    back = redactor.restorer(out)
    assert back.feed('{"to": "<EMAIL_ADDRESS_1>"}') + back.flush() == json.dumps({"to": EMAIL})


def test_stored_bodies_keep_tool_calls_redacted_and_images_by_digest(
    tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    keyring = SubjectKeyring.in_state_dir(tmp_path)
    builder = RecordBuilder(data_policies, scrubber, keyring)
    image = {
        "role": "user",
        "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": PNG}}],
    }
    exchange = make_exchange(output="", output_tool_calls=(CALL,), skipped=(("local-gpt", "lacks_tools"),))
    exchange = replace(exchange, input_messages=[*TOOL_TURNS, image])
    entry = builder.build(exchange)  # support/reply is `personal`: stored redacted
    key = keyring.key_for(f"{exchange.ctx.team}/{exchange.ctx.user}")[1]
    bodies = {b.part: unseal(key, b.data, f"{exchange.ctx.request_id}/{b.part}") for b in entry.bodies}
    stored_in, stored_out = json.loads(bodies["input"]), json.loads(bodies["output"])
    assert EMAIL not in bodies["input"] and PHONE not in bodies["input"] and "iVBOR" not in bodies["input"]
    assert stored_in[3]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,<sha256:")
    assert stored_out["tool_calls"][0]["function"]["name"] == "send_mail"
    assert EMAIL not in bodies["output"] and "EMAIL_ADDRESS" in bodies["output"]
    assert [(s.model, s.reason) for s in entry.record.skipped] == [("local-gpt", "lacks_tools")]
