"""The journaling proxy on the Anthropic Messages API alone: the paths it forwards
unjournaled. (What the proxy promises on every API: test_proxy_contract.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_cases import ANTHROPIC_CASE, Rig, open_rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with open_rig(tmp_path, ANTHROPIC_CASE) as rig:
        yield rig


def test_other_paths(rig: Rig) -> None:
    request = ANTHROPIC_CASE.request("hello")
    status, body, _ = rig.post(request, path="/v1/messages/count_tokens")
    assert status == 200 and "input_tokens" in json.loads(body)
    assert rig.steps() == []  # not journaled
    status, _, _ = rig.post({}, path="/v1/files")
    assert status == 404
