"""What every CLI agent shares: where the CLI runs (host.py, docker_host.py, reaper.py),
its launches, hooks, MCP host tools, waits, session records and Node helpers. Imports
adapters.proxy, adapters.base and the layers below; never an agent's package."""
