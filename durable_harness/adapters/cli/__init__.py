"""What every CLI agent shares: the one CLI adapter (agent.py) and the spec it is driven
by (spec.py), where the CLI runs (where.py, host.py, docker_host.py, reaper.py), its
launches, hooks, MCP host tools, waits, session records and Node helpers. Imports
adapters.proxy, adapters.base and the layers below; never an agent's package."""
