"""A program's own agent loop on the Python API (docs/python-api.md)."""
