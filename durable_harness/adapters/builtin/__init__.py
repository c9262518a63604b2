"""The built-in agent (agent.py): an Anthropic Messages loop whose every model and tool
call is a journal step. Imports adapters.base, harness, sandbox and core; no other
agent's package."""
