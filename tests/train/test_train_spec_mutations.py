"""A bad training job spec is refused with an error that names the file, whatever is wrong.

Each example takes a shipped config (`train_jobs/configs/`), changes one thing in it (see
`tests/mutations.py`) and does what a researcher's commands do with the file before any
worker starts: `load_job_spec` (`switchyard train run`), the planner's reading of it and its
plan and strategy comparison (`switchyard plan --spec`, `--compare`), and the DeepSpeed
config a ZeRO job builds. Each step either works or raises the error its command reports
(`JobSpecError` naming the file, or `PlanError`): never another exception, which would reach
the researcher as a traceback. Hypothesis prints the change.

`make test` runs `examples(150)` changes (a few seconds); `SWITCHYARD_EXAMPLES_SCALE` runs more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from switchyard.train.deepspeed_engine import deepspeed_config
from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.from_spec import load_spec_input
from switchyard.train.plan.hardware import ClusterSpec
from switchyard.train.plan.planner import compare, plan
from switchyard.train.spec import JobSpecError, load_job_spec
from switchyard.train.strategy import Strategy
from tests.examples import examples
from tests.mutations import mutate

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "train_jobs" / "configs").glob("*.yaml"))
ZERO = {Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3}


def _use(path: Path) -> None:
    spec = load_job_spec(path)
    if spec.parallel.strategy in ZERO:
        deepspeed_config(spec, bf16=True)
        deepspeed_config(spec, bf16=False)
    given = load_spec_input(path)
    cluster = ClusterSpec(gpus=given.gpus)
    plan(given.shape, cluster, given.job)
    compare(given.shape, cluster, given.job)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_changed_job_spec_is_refused_by_name_or_plans(data: st.DataObject) -> None:
    config = data.draw(st.sampled_from(CONFIGS), label="config")
    doc, change = mutate(yaml.safe_load(config.read_text()), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / config.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        try:
            _use(path)
            event("planned")
        except JobSpecError as exc:
            event("refused: JobSpecError")
            assert config.name in str(exc), f"{config.name}: {change}: the error does not name the file: {exc}"
        except PlanError:
            event("refused: PlanError")  # `switchyard plan` prints it as its error
        except Exception as exc:
            raise AssertionError(f"{config.name}: {change}: {type(exc).__name__}: {exc}") from exc
