"""The platform's shared state: one SQL text over SQLite (embedded, one host) or Postgres (a cluster).

- `engine`: the two backends behind one `Database` protocol.
- `migrations`: each store's schema versions, applied by `switchyard up`, checked at open.
- `location`: which database each store uses (`SWITCHYARD_DATABASE_URL`, else SQLite files in
  the state directory), and the layouts that are refused.
"""
