"""The one YAML loader (`switchyard.config_file`) and every platform loader that goes through it:
strict UTF-8, duplicate keys, alias bombs, size limits, and errors naming file, line and field."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from switchyard.audit.data_policy import DataPolicyError, load_data_policies
from switchyard.cluster.serve_configs import load_configs
from switchyard.config_file import ConfigFileError, Problem, parse_yaml, read_bytes, read_yaml, validate
from switchyard.gateway.evals import EvalFileError, load_record
from switchyard.scheduler.core.config import PolicyFileError, load_policy_file
from switchyard.train.spec import JobSpecError, load_job_spec

REPO = Path(__file__).resolve().parents[1]


def problems(raw: bytes, **kwargs: int) -> list[str]:
    with pytest.raises(ConfigFileError) as info:
        parse_yaml(raw, "f.yaml", **kwargs)  # type: ignore[arg-type]
    return [str(p) for p in info.value.problems]


def test_anchors_and_merge_keys_still_work_and_lines_are_known() -> None:
    doc = parse_yaml(b"base: &b {x: 1, y: 2}\nchild:\n  <<: *b\n  y: 3\nlist:\n  - *b\n  - z\n", "f.yaml")
    assert doc.data == {"base": {"x": 1, "y": 2}, "child": {"x": 1, "y": 3}, "list": [{"x": 1, "y": 2}, "z"]}
    assert doc.line_of(("child", "y")) == 4 and doc.line_of(("list", 1)) == 7
    assert doc.line_of(("child", "y", "deeper")) == 4 and doc.line_of(("nowhere",)) is None
    assert doc.line_of(("child", "x")) == 2  # a merged key is where the anchor wrote it


def test_duplicate_keys_name_both_lines() -> None:
    assert problems(b"a: 1\nb:\n  c: 1\n  c: 2\n") == [
        "f.yaml: b.c: duplicate key 'c': first at line 3, again at line 4 (line 4)"
    ]
    assert problems(b"on: 1\ntrue: 2\n")[0].startswith("f.yaml: true: duplicate key 'true': first at line 1")


def test_invalid_utf8_names_line_and_column() -> None:
    assert problems("a: 1\nb: né\n".encode("latin-1")) == ["f.yaml: line 2: not valid UTF-8: byte 0xe9 at column 5"]
    assert problems("a: ü\nb: é\n".encode()[:-3] + b"\xff\n")[0].startswith("f.yaml: line 2: not valid UTF-8")


def test_alias_bomb_and_recursive_alias_fail_fast() -> None:
    bomb = "l0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
    )
    started = time.monotonic()
    assert problems(bomb.encode()) == ["f.yaml: aliases expand to more than 1000000 YAML nodes (an alias bomb?)"]
    assert time.monotonic() - started < 1.0
    assert problems(b"a: &x [1, *x]\n") == ["f.yaml: line 1: an alias refers to the node that contains it"]
    assert parse_yaml(bomb.encode(), "f.yaml", max_nodes=10**10).data["l1"][0][0] == "a"  # a limit, not a ban


def test_empty_not_a_mapping_and_syntax_errors() -> None:
    assert problems(b"# only a comment\n") == ["f.yaml: file is empty"]
    assert problems(b"- a\n- b\n") == ["f.yaml: line 1: the file must hold a mapping of keys, got list"]
    assert parse_yaml(b"- a\n", "f.yaml", mapping=False).data == ["a"]
    assert problems(b"a: [1,\n")[0].startswith("f.yaml: line 2: not valid YAML: ")
    assert problems(b"a: 1\n---\nb: 2\n")[0].startswith("f.yaml: line 2: not valid YAML: ")
    assert problems(b"a: !!python/object:os.system x\n")[0].startswith("f.yaml: line 1: not valid YAML: ")
    assert problems(b"a: \x01\n")[0] == "f.yaml: line 1: not valid YAML: character U+0001 is not allowed"
    assert problems(b"[" * 5000 + b"]" * 5000)[0].startswith("f.yaml: ")


def test_read_limits_size_before_and_after_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(50 * 1024 * 1024)
    started = time.monotonic()
    with pytest.raises(ConfigFileError, match="file is 52428800 bytes or more, over the limit of 4194304"):
        read_yaml(big)
    assert time.monotonic() - started < 0.5
    # /proc files report size 0 and then give more: the length read is checked too.
    with pytest.raises(ConfigFileError, match="over the limit of 10 bytes"):
        read_bytes("/proc/self/status", max_bytes=10)
    with pytest.raises(ConfigFileError, match="cannot read: file is missing"):
        read_yaml(tmp_path / "nope.yaml")
    with pytest.raises(ConfigFileError, match="not a regular file"):
        read_yaml(tmp_path)


def test_read_yaml_hashes_exactly_the_bytes_parsed(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_bytes(b"a: 1\n")
    doc = read_yaml(path, name="a.yaml")
    assert (doc.name, doc.data, doc.raw) == ("a.yaml", {"a": 1}, b"a: 1\n")
    assert doc.sha256 == hashlib.sha256(b"a: 1\n").hexdigest()


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    items: list[_Inner]


def test_validate_names_field_and_line_never_the_input() -> None:
    doc = parse_yaml(b"name: x\nitems:\n  - size: 1\n  - size: secret-value\n  - {size: 2, colour: red}\n", "f.yaml")
    with pytest.raises(ConfigFileError) as info:
        validate(doc, _Outer)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("f.yaml: items.1.size: Input should be a valid integer")
    assert lines[0].endswith("(line 4)")
    assert lines[1] == "f.yaml: items.2.colour: Extra inputs are not permitted (line 5)"
    assert "secret-value" not in str(info.value) and "red" not in str(info.value)
    missing = parse_yaml(b"items: []\n", "f.yaml")
    with pytest.raises(ConfigFileError, match=r"^f\.yaml: name: Field required$"):
        validate(missing, _Outer)


def test_problem_format() -> None:
    assert str(Problem("f.yaml", "m")) == "f.yaml: m"
    assert str(Problem("f.yaml", "m", 3)) == "f.yaml: line 3: m"
    assert str(Problem("f.yaml", "m", 3, "a.b")) == "f.yaml: a.b: m (line 3)"
    assert str(ConfigFileError("f.yaml", [Problem("f.yaml", "m"), Problem("f.yaml", "n", 2)])) == (
        "f.yaml: m\nf.yaml: line 2: n"
    )


# Each platform loader goes through the shared one and keeps its own exception type.


def test_job_spec_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nsteps: 3\nsteps: 30\n")
    expected = r"job\.yaml: steps: duplicate key 'steps': first at line 2, again at line 3"
    with pytest.raises(JobSpecError, match=expected):
        load_job_spec(path)


def test_scheduler_file_bad_utf8_and_field_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"policy:\n  ordering: fifo \xe9\n")
    with pytest.raises(PolicyFileError, match=r"s\.yaml: line 2: not valid UTF-8: byte 0xe9 at column 18"):
        load_policy_file(path)
    path.write_text("policy:\n  ordering: fifo\n  ordring: fifo\n")
    with pytest.raises(PolicyFileError, match=r"s\.yaml: policy\.ordring: Extra inputs are not permitted \(line 3\)"):
        load_policy_file(path)


def test_serve_config_duplicate_key_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "vision.yaml"
    path.write_text("applications:\n  - name: vision--a\napplications: []\n")
    with pytest.raises(ValueError, match=r"vision\.yaml: applications: duplicate key .* at line 1, again at line 3"):
        load_configs([path])


def test_eval_record_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "gpt-4o.yaml"
    path.write_text("team: a\nscore: 0.9\nscore: 0.1\n")
    expected = r"gpt-4o\.yaml: score: duplicate key 'score': first at line 2, again at line 3"
    with pytest.raises(EvalFileError, match=expected):
        load_record(path)


def test_data_policies_bad_utf8(tmp_path: Path) -> None:
    text = (REPO / "policies" / "data_policies.yaml").read_bytes()
    (tmp_path / "data_policies.yaml").write_bytes(text.replace(b"classes:\n", b"classes:\n  # caf\xe9\n", 1))
    line = text[: text.index(b"classes:\n")].count(b"\n") + 2
    with pytest.raises(DataPolicyError, match=rf"data_policies\.yaml: line {line}: not valid UTF-8: byte 0xe9"):
        load_data_policies(tmp_path)
