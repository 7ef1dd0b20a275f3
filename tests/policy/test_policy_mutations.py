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

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.budgets.resolve import flow_limits
from switchyard.gateway.capabilities import Needs
from switchyard.gateway.evals import EvalVerdict, load_suite, suite_path
from switchyard.gateway.planning import FlowCache
from switchyard.gateway.prompting import CompiledPrompts, choose_version
from switchyard.gateway.routing import pick_primary, plan_route
from switchyard.paths import repo_root
from switchyard.policy.errors import PolicyError
from switchyard.policy.layering import longest_deadline_s
from switchyard.policy.loader import load_policy_set, policy_files
from switchyard.policy.published import published
from switchyard.scheduler.core.config import SchedulerFile
from switchyard.scheduler.core.scheduler import Scheduler
from tests.examples import examples

SHIPPED = repo_root() / "policies"
FILES = [str(p.relative_to(SHIPPED)) for p in policy_files(SHIPPED)]
OTHER_VALUES: tuple[Any, ...] = (None, 0, -1, 10**15, 1.5, math.nan, "", "ghost", True, [], {}, ["ghost"], {"ghost": 1})


def _mutate(doc: Any, draw: Any) -> tuple[Any, str]:
    """`doc` with one thing changed somewhere in it, and what was changed."""
    path: list[Any] = []
    node = doc
    while isinstance(node, dict | list) and node and draw(st.integers(0, 99)) >= 30:
        key = draw(st.sampled_from(sorted(node, key=str) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]
    if not path:
        return draw(st.sampled_from(OTHER_VALUES)), "the whole file replaced"
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    where = "/".join(map(str, path))
    op = draw(st.sampled_from(("delete", "replace", "rename", "scale", "double", "add_key")))
    value = parent[last]
    if op == "delete":
        del parent[last]
        return doc, f"{where} deleted"
    if op == "rename" and isinstance(value, str):
        parent[last] = f"{value}-ghost"
        return doc, f"{where} renamed to {parent[last]!r}"
    if op == "scale" and isinstance(value, int | float) and not isinstance(value, bool):
        factor = draw(st.sampled_from((0, -1, 1000, 0.5)))
        parent[last] = value * factor
        return doc, f"{where} times {factor}"
    if op == "double" and isinstance(parent, list):
        parent.insert(last, value)
        return doc, f"{where} doubled"
    if op == "add_key" and isinstance(value, dict):
        value["ghost"] = draw(st.sampled_from(OTHER_VALUES))
        return doc, f"{where}: unknown key added"
    parent[last] = draw(st.sampled_from(OTHER_VALUES))
    return doc, f"{where} replaced by {parent[last]!r}"


def _use(root: Path) -> None:
    """Load the set and, when it loads, build what the platform builds from it."""
    ps = load_policy_set(root)
    published(ps)
    longest_deadline_s(ps)
    Scheduler(SchedulerFile.model_validate(ps.scheduler).to_policy())
    flows, prompts = FlowCache(), CompiledPrompts()
    for team, policy in ps.teams.items():
        for name in policy.flows:
            flow = flows.get(ps, team, name)
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
    doc, change = _mutate(yaml.safe_load((SHIPPED / rel).read_text()), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "policies"
        shutil.copytree(SHIPPED, root)
        (root / rel).write_text(yaml.safe_dump(doc, sort_keys=False))
        try:
            _use(root)
        except PolicyError as exc:
            assert exc.violations, f"{rel}: {change}: refused without a violation"
            # Each names a file of the set: the changed one, or one whose reference into it
            # broke (a prompt version deleted: the flows that use it).
            nowhere = sorted({v.file for v in exc.violations if not (root / v.file).is_file()})
            assert not nowhere, f"{rel}: {change}: violations name no file of the set: {nowhere}\n{exc}"
        except Exception as exc:
            raise AssertionError(f"{rel}: {change}: {type(exc).__name__}: {exc}") from exc
