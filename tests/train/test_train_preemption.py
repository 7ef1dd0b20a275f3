from __future__ import annotations

from pathlib import Path

import _workers
import pytest
import torch

from switchyard.scheduler.preemption_channel import PreemptionNotice
from switchyard.train.launch import spawn_group
from switchyard.train.preemption import FilePreemptionChannel, PreemptionWatcher, SigtermFlag


def test_notice_round_trips_through_json() -> None:
    n = PreemptionNotice("job-1", "higher priority", deadline=123.5)
    assert PreemptionNotice.from_json(n.to_json()) == n and n.lease_id is None
    leased = PreemptionNotice("wl-1", "reclaim for wl-2", 200.0, sent_at=80.0, lease_id="lease-7")
    assert PreemptionNotice.from_json(leased.to_json()) == leased


def test_a_notice_written_before_lease_ids_reads_without_one() -> None:
    """The JSON the channel held before a notice carried its lease id (a job or scheduler of an
    older version may have written it)."""
    old = '{"deadline": 123.5, "job_id": "job-1", "reason": "reclaim for wl-2", "sent_at": 100.25}'
    assert PreemptionNotice.from_json(old) == PreemptionNotice("job-1", "reclaim for wl-2", 123.5, sent_at=100.25)
    assert PreemptionNotice.from_json(old.replace("123.5", "null").encode()).deadline is None


def test_file_channel_posts_a_notice_as_it_is(tmp_path: Path) -> None:
    channel = FilePreemptionChannel(tmp_path)
    notice = PreemptionNotice("wl-1", "drain for node n0", 70.0, sent_at=10.0, lease_id="lease-1")
    channel.post(notice)
    assert channel.poll("wl-1") == notice


def test_file_channel_send_poll_clear(tmp_path: Path) -> None:
    channel = FilePreemptionChannel(tmp_path)
    assert channel.poll("job-1") is None
    sent = channel.send_notice("job-1", "quota", deadline=10.0)
    assert channel.poll("job-1") == sent and channel.poll("job-2") is None
    channel.clear("job-1")
    assert channel.poll("job-1") is None
    with pytest.raises(ValueError, match="invalid job id"):
        channel.send_notice("../etc", "x")


def test_single_process_watcher_sees_sigterm_and_notice(tmp_path: Path) -> None:
    channel = FilePreemptionChannel(tmp_path)
    flag = SigtermFlag()
    watcher = PreemptionWatcher(channel, "j", rank=0, device=torch.device("cpu"), sigterm=flag)
    assert watcher.check(1) is None
    flag.received.set()
    assert watcher.check(2) == PreemptionNotice("j", "SIGTERM", sent_at=watcher.check(3).sent_at)  # type: ignore[union-attr]
    watcher2 = PreemptionWatcher(channel, "j", rank=1, device=torch.device("cpu"))
    channel.send_notice("j", "quota")
    assert watcher2.check(1) is None  # only rank 0 reads the channel


def test_all_ranks_stop_at_the_same_step(tmp_path: Path) -> None:
    """A notice read by rank 0, or SIGTERM delivered to rank 1 only, stops both ranks after
    the same step, with a complete checkpoint, and status preempted/resumable."""
    spawn_group(
        _workers.preempt_mid_run,
        2,
        str(tmp_path),
        finished=lambda: all((tmp_path / f"rank{r}.json").is_file() for r in (0, 1)),
    )
    ranks = [_workers.read_json(tmp_path / f"rank{r}.json") for r in (0, 1)]
    for trigger in ("notice", "sigterm"):
        results = [r[trigger] for r in ranks]
        assert [r["step"] for r in results] == [3, 3], trigger
        assert all(r["status"] == "preempted" and r["resumable"] for r in results)
        assert results[0]["checkpoint"].endswith("step-00000003")
        assert (Path(results[0]["checkpoint"]) / "manifest.json").is_file()
    assert ranks[0]["notice"]["reason"] == "test notice"
    assert ranks[0]["sigterm"]["reason"] == "stop agreed by another rank"
    assert ranks[1]["sigterm"]["reason"] == "SIGTERM"


def test_check_steps_follow_rank_0s_clock_from_the_resumed_step() -> None:
    """Resumed at step 50, checks every 5 s: 1 s per step until step 60, then 0.5 s. Each
    check predicts the next from the time per step since the previous one."""
    now = [0.0]
    watcher = PreemptionWatcher(
        None, "j", rank=0, device=torch.device("cpu"), check_every_s=5, first_step=50, clock=lambda: now[0]
    )
    checked = []
    for step in range(51, 80):
        now[0] += 1.0 if step < 60 else 0.5
        if watcher.due(step):
            assert watcher.check(step) is None
            checked.append((step, now[0]))
    # 51: first step of the run; 56: 5 s later; 61 after 4 s (steps sped up mid-way, so the
    # prediction from 1 s steps came early, never late); then 0.8 s and 0.5 s per step.
    assert checked == [(51, 1.0), (56, 6.0), (61, 10.0), (67, 13.0), (77, 18.0)]


class _SilentChannel(FilePreemptionChannel):
    """A channel whose transport fails the first read (a GCS that did not answer)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.failures = 1

    def poll(self, job_id: str) -> PreemptionNotice | None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("GCS did not answer")
        return super().poll(job_id)


@pytest.mark.parametrize(
    "written", ['{"job_id": "j", "reason": "quota"', '{"job_id": "j", "reason": "quota"}', "[]", "\udcff"]
)
def test_a_notice_that_cannot_be_read_stops_the_job_and_raises_nowhere(tmp_path: Path, written: str) -> None:
    """Found reading the watcher (stop 44): rank 0 read the channel outside any guard, so a notice
    file edited by hand (cut short, a field missing, another shape) raised out of `check` on rank
    0 alone, and every other rank then waited in the check's all-reduce until it timed out. Now
    rank 0 stops the job as if noticed (it checkpoints; nothing is lost), on every rank alike."""
    channel = FilePreemptionChannel(tmp_path)
    (tmp_path / "j.json").write_text(written, errors="surrogateescape")
    watcher = PreemptionWatcher(channel, "j", rank=0, device=torch.device("cpu"))
    notice = watcher.check(1)
    assert notice is not None and notice.reason.startswith("unreadable preemption notice"), notice


def test_a_channel_that_does_not_answer_is_read_again_at_the_next_check(tmp_path: Path) -> None:
    channel = _SilentChannel(tmp_path)
    channel.send_notice("j", "quota")
    watcher = PreemptionWatcher(channel, "j", rank=0, device=torch.device("cpu"), check_every_s=3600)
    assert watcher.check(1) is None  # the read failed: no notice, no exception
    notice = watcher.check(2)  # read again at once, although check_every_s has not passed
    assert notice is not None and notice.reason == "quota"
