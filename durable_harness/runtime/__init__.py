"""The runtime: the worker, starting and resuming turns, the signal server, what ``show``
and ``ls`` print, the public Python API and the configured World. Wires the layers below
together (adapters, harness, worlds, sandbox, core); never imports testing/ or the CLI."""
