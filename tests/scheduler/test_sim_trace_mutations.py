"""`switchyard sim` on a generic job CSV with one thing changed: a cell given a value of another
kind (empty, negative, huge, not a number, not finite, a date that does not exist, a repeated
id), a header renamed, a row repeated or cut short. The run must either replay the trace or stop
with an error that names the file, and never with a traceback or another exit code.

Found by the first version of this test, run as a script (stop 44): a GPU count of twenty
digits raised OverflowError out of the reader, and one of nine digits took 6.6 GB and 80 s
(`test_sched_sim_trace.py` keeps those rows). Pure (no Ray): `make test` runs `examples(60)`.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.cli import main
from tests.examples import examples

HEADER = ["submit_time", "duration_s", "gpus", "team", "priority_class", "gpu_type", "gang", "job_id"]
ROWS = [
    ["2031-05-02T09:00:00", "3600", "8", "a", "training", "", "1x8", "j1"],
    ["2031-05-02T09:30:00Z", "1800", "2", "b", "", "", "", "j2"],
    ["1935644400", "7200", "16", "b", "", "", "2x8", "j3"],
    ["2031-05-03T00:00:00", "60", "1", "a", "exploratory", "", "", "j4"],
]
ODD_CELLS = (
    *("", " ", "0", "-1", "1.5", "8.0", "+8", "  8  ", "\uff11", "x", "True", "None", '"', "a,b", "é"),
    *("1e400", "nan", "inf", "-inf", "-1e9", "1e-9", "99999999999999999999", "123456789"),
    *("2x", "x8", "0x8", "8x0", "1x8x8", "100000x8", "3x8"),
    *("2031-02-30T00:00:00", "2031-05-02", "1970-01-01T00:00:00", "0001-01-01T00:00:00", "9999-12-31T23:59:59"),
    *("training", "production-inference", "vip", "H100", "j1", "b", "nobody"),
)


def _csv(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_changed_trace_replays_or_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    header, rows = list(HEADER), [list(r) for r in ROWS]
    how = data.draw(st.sampled_from(["cell", "cell", "cell", "cell", "header", "repeat", "short"]), label="how")
    if how == "header":
        header[data.draw(st.integers(0, len(header) - 1))] = data.draw(st.sampled_from(["", "GPUS", "team", "x"]))
    elif how == "repeat":
        rows.append(list(data.draw(st.sampled_from(rows))))
    elif how == "short":
        del data.draw(st.sampled_from(rows))[data.draw(st.integers(0, len(header) - 1)) :]
    else:
        row, column = data.draw(st.integers(0, len(rows) - 1)), data.draw(st.integers(0, len(header) - 1))
        rows[row][column] = data.draw(st.sampled_from(ODD_CELLS), label=f"{HEADER[column]} of row {row + 1}")
    trace = tmp_path / "jobs.csv"
    trace.write_text(_csv(header, rows))
    (tmp_path / "teams.csv").write_text("vc,node num\na,1\nb,1\n")
    capsys.readouterr()
    args = ["sim", "--trace", str(trace), "--teams", str(tmp_path / "teams.csv"), "--gpus", "16", "--no-inference"]
    code = main([*args, "--no-anomaly", "--json"])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code in (0, 2), f"exit {code}: {err}"
    if code == 2:
        assert str(trace) in err, f"the error does not name the trace: {err}"
