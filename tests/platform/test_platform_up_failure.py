"""A head that fails to start is reported by `switchyard up` as its error, not its traceback."""

from __future__ import annotations

from switchyard.cli.up import failure_excerpt


def test_a_failed_head_is_reported_without_its_traceback() -> None:
    """What CI's `switchyard up` printed when HAProxy could not bind: forty lines of Ray
    traceback around the two that mattered."""
    log = """2026-12-01 14:00:01 INFO starting Ray
Traceback (most recent call last):
  File "/x/ray/_private/worker.py", line 3009, in get
    values, debugger_breakpoint = worker.get_objects(
                                  ^^^^^^^^^^^^^^^^^^^
  File "/x/ray/_private/worker.py", line 1053, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(RuntimeError): \x1b[36mray::HAProxyManager.ready()\x1b[39m (pid=1)
  File "/x/ray/serve/_private/haproxy.py", line 2107, in _reload_haproxy
    await self._haproxy_start_task
RuntimeError: HAProxy crashed during startup: [NOTICE] haproxy version is 2.8.25
[ALERT]    (24397) : Binding [haproxy.cfg:95] for proxy stats: cannot bind socket (Address already in use)
"""
    excerpt = failure_excerpt(log)
    assert "Traceback" not in excerpt and 'File "' not in excerpt and "^^^" not in excerpt
    assert "\x1b[" not in excerpt and "worker.get_objects" not in excerpt
    assert "RuntimeError: HAProxy crashed during startup" in excerpt
    assert "cannot bind socket (Address already in use)" in excerpt
    assert failure_excerpt("") == "(the log says nothing more)"
