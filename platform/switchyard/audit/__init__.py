"""The audit log and data policy: what is sent, what is stored, and proof it was not altered.

Pure core (no Ray): data-policy application, redaction (Presidio, offline), the versioned
audit record, the hash chain, the SQLite store, the async spool, per-subject body
encryption with erasure, retention, S3 export of sealed segments, role-checked queries.
"""
