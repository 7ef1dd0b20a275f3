"""The background refresh: a key created after start-up works once the snapshot refreshes,
a revoked key stops working, and a bad policy edit never replaces the set in force."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from switchyard.gateway.errors import Unauthenticated
from switchyard.gateway.runtime import Refresher, Sources
from switchyard.policy.keys import SCHEMA as KEYS_SCHEMA
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import Role
from switchyard.policy.store import PolicyStore
from tests.shared_db import fresh_postgres, postgres_url

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


async def test_a_key_database_that_hangs_holds_back_no_policy_change(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    """Stop 49: the refresher promised that a locked key database never holds back a policy
    change, but it refreshed keys, then policies, in one loop: a key read that hung (Postgres
    behind a lock, here a migration's ACCESS EXCLUSIVE one) stopped policy refreshes for as long.
    Now each source refreshes on its own."""
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    keys = KeyStore(fresh_postgres(KEYS_SCHEMA))
    sources = Sources(PolicyStore(policies, state), keys)
    refresher = Refresher(sources, sources.key_snapshot(), refresh_s=0.05)
    loop = asyncio.create_task(refresher.run())
    holder = psycopg.connect(postgres_url(), autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE key_events IN ACCESS EXCLUSIVE MODE")
        await asyncio.sleep(0.3)  # a key refresh is waiting on the lock
        before = sources.policies.current
        qa = yaml.safe_load((policies / "teams" / "qa.yaml").read_text())
        qa["description"] = "changed while the key database hangs"
        (policies / "teams" / "qa.yaml").write_text(yaml.safe_dump(qa))
        deadline = time.monotonic() + 5
        while sources.policies.current is before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sources.policies.current is not before, "the policy change waited for the key database"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop  # no refresh starts once the store is closed
        keys.close()
