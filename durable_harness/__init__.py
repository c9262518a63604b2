"""durable-harness: crash-safe AI coding agents.

Every model and tool call of a turn is journaled (intent before, outcome after) in a
World; any worker can finish a turn whose process died, reading finished calls back and
following each interrupted tool's declared replay rule.
"""

from durable_harness.core.version import __version__

__all__ = ["__version__"]
