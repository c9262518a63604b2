"""The opencode agent: the real ``opencode`` CLI behind the journaling proxy (adapter.py),
with its private HOME, provider choice, journaling plugin (plugin.js), session database,
MCP host tools and canonical request form. Imports adapters.cli, adapters.proxy and the
layers below; no other agent's package."""
