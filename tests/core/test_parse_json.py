"""``parse_json``: what an untrusted side sends nested deeper than the parser goes is a
ValueError (bad JSON, refused), never a RecursionError that kills the reader: checked on
the helper and on the ACP transport, which reads an untrusted agent's stdout."""

from __future__ import annotations

import asyncio

import pytest

from durable_harness.adapters.acp.transport import BoundedTransport
from durable_harness.adapters.cli.host import json_event
from durable_harness.adapters.cli.records import jsonl_messages
from durable_harness.core.canonical import parse_json

DEEP = b"[" * 20_000 + b"]" * 20_000  # far past the parser's depth, under 64 KiB


def test_a_document_nested_too_deep_is_bad_json() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json(DEEP)
    assert parse_json(b'{"a": [1]}') == {"a": [1]}
    assert json_event(DEEP) is None
    assert list(jsonl_messages(DEEP + b'\n{"message": {"id": "m"}}\n')) == [{"id": "m"}]


def test_the_acp_transport_ends_the_connection_at_a_line_nested_too_deep() -> None:
    async def read() -> tuple[object, str | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(DEEP + b"\n")
        reader.feed_eof()
        transport = BoundedTransport(reader, writer=None)  # type: ignore[arg-type]
        return await transport.receive(), transport.broken

    message, broken = asyncio.run(read())
    assert message is None
    assert broken is not None and "not an ACP agent" in broken
