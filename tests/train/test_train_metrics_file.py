"""A run's `metrics.jsonl` after a crash or damage: every whole line is read, the rest named.

A run killed while writing a line (a node lost, SIGKILL) leaves part of it at the end of the
file; the resumed run appends to the same file. `switchyard train plot` and the console's
training page read it: they must draw every whole line and say which lines they skipped,
never refuse the run for one bad line nor raise something else (a traceback to the user, a
console page that fails).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from switchyard.cli import main
from switchyard.console.figures import run_curves
from switchyard.train.metrics_log import METRICS_FILE, MetricsFileError, MetricsRecord, read_metrics
from switchyard.train.metrics_plot import plot_metrics
from switchyard.train.step_metrics import MetricsLine
from tests.examples import examples
from tests.mutations import OTHER_VALUES, damage_lines


def _line(step: int) -> MetricsLine:
    return MetricsLine(
        step=step,
        loss=4.0 / step,
        lr=1e-3,
        grad_norm=None if step % 3 else 0.5,
        tokens_per_s=1000.0 + step,
        step_time_s=0.25,
        mfu=None,
        memory_bytes=2**20 * step,
        memory_kind="peak_rss",
        val_loss=3.0 / step if step % 4 == 0 else None,
    )


def test_a_run_killed_mid_line_then_resumed_is_plotted_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The part line was joined to the resumed run's first line, and `train plot` refused the
    whole run (`line 4 is not a metrics line`), as did the console, which showed no curve."""
    first = MetricsRecord(tmp_path)
    for step in (1, 2, 3):
        first.write(_line(step))
    first.close()
    path = tmp_path / METRICS_FILE
    with path.open("a", encoding="utf-8") as f:  # killed while writing step 4's line
        f.write(json.dumps(_line(4).as_dict(), sort_keys=True)[:40])
    resumed = MetricsRecord(tmp_path)  # from the checkpoint of step 3
    for step in (4, 5):
        resumed.write(_line(step))
    resumed.close()

    read = read_metrics(path)
    assert [row["step"] for row in read.rows] == [1, 2, 3, 4, 5]
    assert read.rows == [_line(step).as_dict() for step in (1, 2, 3, 4, 5)]
    assert len(read.skipped) == 1 and read.skipped[0].startswith("line 4: not JSON")
    assert main(["train", "plot", str(tmp_path), "--out", str(tmp_path / "curve.png")]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "curve.png")
    assert f"{path}: 1 line(s) skipped: line 4: not JSON" in captured.err


def test_a_file_of_no_metrics_line_is_refused_naming_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / METRICS_FILE
    path.write_bytes(b'{"step": 1, "loss": "\xff"}\n[1, 2]\n')  # not UTF-8 once: it raised UnicodeDecodeError
    with pytest.raises(MetricsFileError, match=r"the metrics file is empty \(2 line\(s\) that are not metrics"):
        read_metrics(path)
    assert main(["train", "plot", str(tmp_path)]) == 2
    assert "line 1: not JSON" in capsys.readouterr().err


def _damage_a_value(path: Path, data: st.DataObject) -> str:
    lines = path.read_text().splitlines()
    n = data.draw(st.integers(0, len(lines) - 1), label="line")
    row = json.loads(lines[n])
    key = data.draw(st.sampled_from(sorted(row)), label="key")
    row[key] = data.draw(st.sampled_from(OTHER_VALUES), label="value")
    lines[n] = json.dumps(row)
    path.write_text("".join(line + "\n" for line in lines))
    return f"line {n + 1}: {key} = {row[key]!r}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_metrics_file_is_read_for_its_whole_lines(data: st.DataObject) -> None:
    """One drawn damage (a byte changed, a line deleted, doubled, swapped, preceded by junk,
    the end cut; or one value of a line replaced by one of another type). Every row read has
    a step and numbers where the plot draws them, and the plot and the console's curves draw
    them. Where the damage moved or cut lines but changed no byte inside one, every row is a
    line as written and only the line damaged is missing."""
    count = data.draw(st.integers(2, 12), label="lines")
    written = {step: _line(step).as_dict() for step in range(1, count + 1)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / METRICS_FILE
        path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in written.values()))
        if data.draw(st.booleans(), label="a value replaced"):
            change = _damage_a_value(path, data)
        else:
            change = damage_lines(path, data, junk=lambda line: line[: len(line) // 2])
        try:
            read = read_metrics(path)
        except MetricsFileError:
            event("refused: no metrics line")
            assert "=" in change, f"{change}: refused, yet whole lines were left"
            return
        event(f"{len(read.skipped)} skipped")
        steps = [row["step"] for row in read.rows]
        assert steps == sorted(set(steps)), f"{change}: steps {steps}"
        for row in read.rows:
            assert isinstance(row["step"], int) and all(
                row.get(k) is None or _is_number(row[k]) for k in ("loss", "tokens_per_s", "val_loss")
            ), f"{change}: {row}"
        if "changed" not in change and "=" not in change:
            assert all(row == written[row["step"]] for row in read.rows), f"{change}: a row not as written"
            assert len(read.rows) >= count - 1, f"{change}: {count - len(read.rows)} whole lines lost"
        run_curves(read.rows)
        plot_metrics(read.rows, Path(tmp) / "curve.png", "damaged")
