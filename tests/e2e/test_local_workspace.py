"""The built-in agent on a host folder (the opt-in local sandbox)."""

from __future__ import annotations

from pathlib import Path

from support import DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, Harness, ids_of, make_harness

from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.journal import decode_output
from durable_harness.worlds import open_world


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


DEEP_SCRIPT = """
[[rule]]
name = "flattened"
when.last_tool_name = "bash"
when.last_tool_result = "FLAT"
reply.text = "Removed the deep folders."

[[rule]]
name = "told it could not be saved: flatten"
when.last_tool_name = "bash"
when.last_tool_result = "could not be saved after this call"
reply.tool_use = [{ name = "bash", input = { command = "rm -rf d && echo FLAT" } }]

[[rule]]
name = "nest"
when.last_user_text = "nest"
reply.tool_use = [
  { name = "bash", input = { command = "mkdir -p $(printf 'd/%.0s' $(seq 1100)) && echo NESTED" } },
]
"""


def test_a_workspace_too_deep_to_save_is_the_steps_error_not_a_dead_turn(
    tmp_path: Path,
) -> None:
    # os.fwalk recurses one level per folder: the snapshot after the call fails, and the
    # model is told so in the call's result (the turn goes on) instead of the turn being
    # retried until it is dead-lettered.
    script = tmp_path / "deep.toml"
    script.write_text(DEEP_SCRIPT)
    for h in make_harness(tmp_path, script):
        work = tmp_path / "work"
        out = h.cli("run", "--workspace", str(work), "nest")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "Removed the deep folders."
        steps = h.show(ids_of(out)["turn"])["steps"]
        assert [s["status"] for s in steps] == ["done"] * 5  # model, bash, model, bash, model
        assert not (work / "d").exists()
        with open_world("local", data_dir=h.tmp / "world") as world:
            nest, flatten = [s for s in world.load_steps(ids_of(out)["turn"]) if s.kind == "tool"]
            result = decode_output(world, nest)
            assert result["is_error"] is True and "NESTED" in result["content"]
            assert "the workspace is nested too deep to snapshot" in result["content"]
            assert "snapshot_error" in nest.meta and "workspace" not in nest.meta
            assert "workspace" in flatten.meta  # saved again once it could be
