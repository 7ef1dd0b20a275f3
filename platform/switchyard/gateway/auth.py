"""Who is calling: the bearer key checked against an in-memory snapshot of the key hashes.

The snapshot (`KeyStore.verifier()`) is replaced when the key database changes (the app
polls `KeyStore.version()` in the background), so no request reads the database. Expiry is
checked against the clock at each request, since a key expiring does not change the database.
"""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.gateway.errors import NotAllowed, Unauthenticated
from switchyard.policy.keys import KeyVerifier, Principal
from switchyard.policy.roles import Action, allowed


class KeySnapshot:
    def __init__(self, verifier: KeyVerifier, version: float = 0.0) -> None:
        self.verifier = verifier
        self.version = version  # the key store's `version()` the snapshot was taken at

    def replace(self, verifier: KeyVerifier, version: float) -> None:
        self.verifier = verifier
        self.version = version

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        value = headers.get("authorization")
        if value is None:
            raise Unauthenticated("missing_api_key", "send your key as `Authorization: Bearer <key>`")
        scheme, _, key = value.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("invalid_authorization", "the Authorization header must be `Bearer <key>`")
        principal = self.verifier.verify(key.strip())
        if principal is None:
            raise Unauthenticated("invalid_api_key", "the API key is unknown, revoked or expired")
        if not allowed(principal, Action.CALL_GATEWAY, principal.team):
            raise NotAllowed(
                "role_not_allowed",
                f"key {principal.key_id} (role {principal.role.value}) may not call the gateway",
            )
        return principal
