"""The background refresh: a key created after start-up works once the snapshot refreshes,
a revoked key stops working, and a bad policy edit never replaces the set in force."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from switchyard.gateway.errors import Unauthenticated
from switchyard.gateway.runtime import Refresher, Sources
from switchyard.policy.models import Role

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_refresh_picks_up_keys_and_keeps_valid_policies(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    sources = Sources.open(policies, state)
    snapshot = sources.key_snapshot()
    refresher = Refresher(sources, snapshot, refresh_s=0.01)
    key, record = sources.keys.create("qa", Role.MEMBER)
    with pytest.raises(Unauthenticated):
        snapshot.authenticate({"authorization": f"Bearer {key}"})
    refresher.refresh_once()
    assert snapshot.authenticate({"authorization": f"Bearer {key}"}).team == "qa"
    sources.keys.revoke(record.key_id)
    refresher.refresh_once()
    with pytest.raises(Unauthenticated):
        snapshot.authenticate({"authorization": f"Bearer {key}"})
    before = sources.policies.current
    (policies / "teams" / "qa.yaml").write_text("team: qa\nflows: {plain: {deadline_ms: -1}}\n")
    refresher.refresh_once()
    assert sources.policies.current is before and sources.policies.last_error is not None
