"""Erasure of a subject: delete its body key and record that it happened, in the chain."""

from __future__ import annotations

import time
import uuid

from switchyard.audit.record import ErasureRecord
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring, subject_of


def erase_subject(
    store: AuditStore, keyring: SubjectKeyring, team: str, user: str | None, erased_by: str
) -> ErasureRecord:
    """Bodies sealed under the subject's key become unreadable; every record and link stays."""
    subject = subject_of(team, user)
    existed = keyring.erase(subject, erased_by)
    record = ErasureRecord(
        request_id=f"erasure-{uuid.uuid4().hex}",
        time=time.time(),
        team=team,
        subject=subject,
        erased_by=erased_by,
        key_existed=existed,
    )
    store.append([record])
    return record
