"""The durable core: the journal runner (journal.py), host tools and their replay labels,
lease renewal, durable waits, workspace snapshots, crash injection and the built-in
agent's model client. Imports only :mod:`durable_harness.core`: never a World or sandbox
backend, never an adapter."""
