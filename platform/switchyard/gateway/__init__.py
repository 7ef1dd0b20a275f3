"""The gateway's request pipeline as a pure core: no Ray import, so it runs in-process in tests
and benchmarks and unchanged inside the Serve replica (`serve_apps/gateway.py`)."""
