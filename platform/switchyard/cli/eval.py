"""`switchyard eval run --flow TEAM/FLOW --candidate MODEL`: run a flow's eval suite against a
candidate model and write the record that lets a high-risk flow fall back to it.

The record goes to `policies/evals/records/<team>/<flow>/<model>.yaml`; review and commit it
like any policy change. It is signed with the state directory's eval signing key and names the
key that ran it (`signed_by`): the gateway ignores a record without a valid signature. Only a
principal that may manage the team's policies (a platform admin) may run it. Exit code 0 when
the score meets the flow's threshold, 1 when not (the record is written either way: a failing
score is evidence too); 3 when the key may not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from switchyard.cli._auth import NotAuthenticated, add_auth_args, require
from switchyard.cli._output import fail, print_json
from switchyard.gateway.eval_runner import EvalSetupError, run_suite
from switchyard.gateway.eval_signing import EvalSigner, EvalSigningKeyError
from switchyard.gateway.evals import EvalFileError, record_path, write_record
from switchyard.gateway.providers.base import ChatProvider, Completion, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.providers.registry import build_provider
from switchyard.gateway.seams import Usage
from switchyard.paths import policies_dir
from switchyard.policy.errors import PolicyError
from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import ProviderKind
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.roles import Action, Forbidden
from switchyard.state import state_dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("eval", help="run eval suites that gate fallback on high-risk flows")
    sub = parser.add_subparsers(dest="eval_command", required=True)
    run = sub.add_parser("run", help="run a flow's suite against a candidate model and write the record")
    run.add_argument("--flow", required=True, help="TEAM/FLOW, e.g. payments/dispute-review")
    run.add_argument("--candidate", required=True, help="a model name from providers.yaml")
    run.add_argument("--policies", help="policy directory (default: the repo's policies/)")
    run.add_argument("--checkpoints", help="checkpoint directory for the local model (default: seeded init)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    add_auth_args(run)
    run.set_defaults(handler=run_eval)


def _provider(ps: PolicySet, candidate: str, checkpoints: str | None) -> ChatProvider:
    entry = ps.providers.models[candidate]
    spec = ps.providers.providers[entry.provider]
    if spec.kind is ProviderKind.LOCAL:
        from switchyard.gateway.local_model import LocalChatModel  # torch: only when needed

        model = LocalChatModel(checkpoints)

        async def answer(call: ProviderCall) -> Completion:
            data = await asyncio.to_thread(model.chat, {"messages": call.messages, "max_tokens": call.max_tokens})
            u = data["usage"]
            return Completion(
                data["choices"][0]["message"]["content"],
                Usage(u["prompt_tokens"], u["completion_tokens"]),
                data["choices"][0]["finish_reason"],
                data["model"],
            )

        return InProcessProvider(entry.provider, answer)
    return build_provider(entry.provider, spec, None)


def run_eval(args: argparse.Namespace) -> int:
    team, _, flow_name = args.flow.partition("/")
    if not flow_name:
        return fail(f"--flow must be TEAM/FLOW, got {args.flow!r}")
    try:
        # A signed record is what lets a high-risk flow fall back: a policy change, not a team's own.
        who = require(args, Action.MANAGE_POLICY, team)
    except (NotAuthenticated, Forbidden) as exc:
        return fail(str(exc), 3)
    root = policies_dir(args.policies)
    try:
        ps = load_policy_set(root)
    except PolicyError as exc:
        return fail(f"the policy set at {root} is invalid:\n{exc}")
    if team not in ps.teams or flow_name not in ps.teams[team].flows:
        return fail(f"no flow {flow_name!r} in teams/{team}.yaml")
    if args.candidate not in ps.providers.models:
        return fail(f"--candidate: unknown model {args.candidate!r} (known: {', '.join(sorted(ps.providers.models))})")
    resolved = resolve_flow(ps, team, flow_name)
    assert not isinstance(resolved, list)
    provider = _provider(ps, args.candidate, args.checkpoints)

    async def go() -> Any:
        try:
            return await run_suite(ps, resolved.policy, args.candidate, provider, args.timeout)
        finally:
            await provider.aclose()

    try:
        record = asyncio.run(go())
    except (EvalSetupError, EvalFileError) as exc:
        return fail(str(exc))
    try:
        record = EvalSigner.in_state_dir(state_dir(args.state_dir)).sign(record, signed_by=who.key_id)
    except (OSError, EvalSigningKeyError) as exc:
        return fail(f"cannot sign the eval record: {exc}")
    path = record_path(root, team, flow_name, args.candidate)
    write_record(path, record)
    print_json({"record": os.path.relpath(path), **record.model_dump(), "passed": record.score >= record.threshold})
    return 0 if record.score >= record.threshold else 1
