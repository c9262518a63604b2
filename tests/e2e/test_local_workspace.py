"""The built-in agent on a host folder (the opt-in local sandbox)."""

from __future__ import annotations

from pathlib import Path

from support import DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of

from durable_harness.harness.crash import CRASH_EXIT_CODE


def test_turn_on_a_host_folder(demo_harness: Harness, tmp_path: Path) -> None:
    work = tmp_path / "work"
    out = demo_harness.cli("run", "--workspace", str(work), "--tools", DEMO_TOOLS, DEMO_PROMPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == DEMO_REPLY
    assert (work / "refunds.md").read_text() == "- order 42: refunded\n"


def test_bash_on_a_host_folder_is_never_rerun(demo_harness: Harness, tmp_path: Path) -> None:
    """On a real folder a shell command's effects survive the crash, so an interrupted
    bash step is not run again: the model is told it possibly ran."""
    h = demo_harness
    work = tmp_path / "work"
    crashed = h.cli(
        "run",
        "--workspace",
        str(work),
        "--tools",
        DEMO_TOOLS,
        DEMO_PROMPT,
        DURABLE_HARNESS_CRASH_AT="7:after_intent",
    )
    assert crashed.returncode == CRASH_EXIT_CODE
    turn_id = ids_of(crashed)["turn"]
    resumed = h.cli("resume", turn_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == DEMO_REPLY
    steps = h.show(turn_id)["steps"]
    assert steps[7]["name"] == "bash" and steps[7]["status"] == "possibly_ran"
    # The scripted model looked again (a new bash step) instead of assuming.
    assert [s["name"] for s in steps[8:]] == ["claude-sonnet-4-5", "bash", "claude-sonnet-4-5"]
