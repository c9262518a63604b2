"""``durable-harness serve``: the HTTP API for apps (``docs/api.md``).

One FastAPI application over any World, served through ``harness/listener`` (uvicorn;
the operator's body cap, header deadline and connection limit apply before any route
runs). It holds no state of its own: tokens (hashed), owners, rate counters, turns and
their event logs are all in the World, so any number of ``serve`` processes and workers
share one World and killing any of them loses nothing.

* :mod:`.auth`: API tokens, ``dh_<id>_<secret>``, the World keeping sha256(secret);
* :mod:`.resources`: sessions and turns (create, read, list, post a turn, cancel);
* :mod:`.signals`: signals, CI webhooks and the event stream's route;
* :mod:`.stream`: the SSE stream and the one follower thread per process;
* :mod:`.rates`: per-tenant limits kept in the World;
* :mod:`.errors`: the one error shape; :mod:`.models`: the wire format (OpenAPI).
"""

from __future__ import annotations

from durable_harness.server.app import ApiServer, build_app, serve

__all__ = ["ApiServer", "build_app", "serve"]
