"""The journaling model proxy (server.py): the model endpoint a CLI agent is pointed at,
with the wire formats of each API (wire/), SSE, and the request canonicalizers. May import
adapters.base and the layers below (harness, core); nothing of cli/ or of an agent's
package."""
