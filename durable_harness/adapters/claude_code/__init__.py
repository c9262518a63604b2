"""adapters.claude_code."""
