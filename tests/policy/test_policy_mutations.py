"""A bad policy file is refused with violations that name it, whatever is wrong with it.

Each example takes the shipped policies, changes one thing in one file (a key deleted or
added, a value of another type or sign, a name that points nowhere, a list item doubled)
and loads the directory. Either `load_policy_set` raises `PolicyError` whose violations each
name a file of the set (the changed one, or one whose reference into it broke), or the set
loads, and then everything the gateway, the budgets and the scheduler
build from a policy set at start and per request builds without raising: a set that passed
`policy check` must never fail the platform later. Hypothesis prints the mutation.

`make test` runs `examples(150)` mutations (about 25 s); `SWITCHYARD_EXAMPLES_SCALE` runs more.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from switchyard.budgets.leased_gate import LeaseConfig, check_lease_bound
from switchyard.budgets.pricing import price_on
from switchyard.budgets.resolve import flow_limits
from switchyard.gateway.capabilities import Needs
from switchyard.gateway.evals import EvalVerdict, load_suite, suite_path
from switchyard.gateway.idempotency import CLAIM_TIMEOUT_S, check_claim_bound
from switchyard.gateway.planning import FlowCache
from switchyard.gateway.prompting import CompiledPrompts, choose_version
from switchyard.gateway.routing import pick_primary, plan_route
from switchyard.paths import repo_root
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set, policy_files
from switchyard.policy.published import published
from switchyard.scheduler.core.config import SchedulerFile
from switchyard.scheduler.core.scheduler import Scheduler
from tests.examples import examples
from tests.mutations import mutate

SHIPPED = repo_root() / "policies"
FILES = [str(p.relative_to(SHIPPED)) for p in policy_files(SHIPPED)]


def _use(root: Path) -> None:
    """Load the set and, when it loads, build what the platform builds from it."""
    ps = load_policy_set(root)
    published(ps)
    for model, entry in ps.providers.models.items():  # every price a request may be charged at
        for price in entry.prices:
            largest = price_on(ps.providers, model, price.effective).estimate_nanos(
                entry.context_window, entry.context_window
            )
            assert largest < 2**63, f"{model}: a call may cost {largest} n$, past the ledger's 64-bit columns"
    Scheduler(SchedulerFile.model_validate(ps.scheduler).to_policy())
    flows, prompts = FlowCache(), CompiledPrompts()
    for team, policy in ps.teams.items():
        for name in policy.flows:
            flow = flows.get(ps, team, name)
            check_lease_bound(LeaseConfig(), flow.deadline_ms / 1000)  # or no gateway replica starts on it
            check_claim_bound(CLAIM_TIMEOUT_S, flow.deadline_ms / 1000)
            primary = pick_primary(ps, flow, "auto")
            needs = Needs(embedding=ps.providers.models[primary].task == "embedding")
            plan_route(ps, flow, primary, lambda *_: EvalVerdict(True, "eval_passed"), needs)
            if flow.eval is not None:  # what `switchyard eval run` reads
                load_suite(suite_path(ps.root, flow.eval.suite))
            version = choose_version(ps, flow, None)
            prompts.get(flow.prompt_id, version)
            flow_limits(ps, team, flow.budget)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_changed_policy_file_is_refused_by_name_or_works(data: st.DataObject) -> None:
    rel = data.draw(st.sampled_from(FILES), label="file")
    doc, change = mutate(yaml.safe_load((SHIPPED / rel).read_text()), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "policies"
        shutil.copytree(SHIPPED, root)
        (root / rel).write_text(yaml.safe_dump(doc, sort_keys=False))
        try:
            _use(root)
            event("loaded and used")
        except PolicyError as exc:
            event("refused")
            assert exc.violations, f"{rel}: {change}: refused without a violation"
            # Each names a file of the set: the changed one, or one whose reference into it
            # broke (a prompt version deleted: the flows that use it).
            nowhere = sorted({v.file for v in exc.violations if not (root / v.file).is_file()})
            assert not nowhere, f"{rel}: {change}: violations name no file of the set: {nowhere}\n{exc}"
        except Exception as exc:
            raise AssertionError(f"{rel}: {change}: {type(exc).__name__}: {exc}") from exc
