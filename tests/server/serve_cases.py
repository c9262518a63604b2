"""What the serve tests import (a module of its own: ``from conftest import`` would take
whichever ``conftest`` a run imported first): the operator's tool set, the World the
harness's processes use, tokens made in it, and the API's error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from support import DEMO, Harness

from durable_harness.core.world import World
from durable_harness.server.auth import create_token
from durable_harness.worlds import open_world

#: The tool set the tests' operator registers, by name, on serve and on the workers.
TOOL_SETS = json.dumps([f"demo={DEMO / 'tools.py'}:TOOLS"])


def world_of(h: Harness) -> World:
    """The World the harness's processes use, opened in the test too."""
    name = h.env.get("DURABLE_HARNESS_WORLD")
    if name == "postgres":
        return open_world(h.env["DURABLE_HARNESS_POSTGRES_URL"])
    if name == "s3sqs":
        return open_world(
            "s3sqs",
            bucket=h.env["DURABLE_HARNESS_S3_BUCKET"],
            queue_url=h.env["DURABLE_HARNESS_SQS_QUEUE_URL"],
        )
    return open_world("local", data_dir=h.env["DURABLE_HARNESS_DATA_DIR"])


def token(world: World, tenant: str, **kwargs: Any) -> str:
    return create_token(world, tenant, **kwargs)[1]


def error_of(response: httpx2.Response) -> tuple[int, str, str]:
    """(status, code, message) of an API error: it must be the API's JSON shape."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message"}, error
    return response.status_code, error["code"], error["message"]
