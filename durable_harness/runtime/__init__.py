"""The runtime: the worker, starting and resuming turns, the signal server, what ``show``
and ``ls`` print, and the public Python API. Wires the layers below together (adapters,
harness, worlds, sandbox, core); never imports testing/ or the CLI."""
