"""The journaling model proxy: the model endpoint a CLI agent is pointed at. server.py (the
listener, routing, hook and MCP dispatch), upstream.py (the client of the real endpoint),
journaling.py (a model call's journal step and the tee), chunked.py (the streamed answer),
sse.py, the wire formats of each API (wire/) and the request canonicalizers. May import
adapters.base and the layers below (harness, core); nothing of cli/ or of an agent's
package."""
