"""Bad input: each a one-line error that says what to do, a non-zero exit, nothing lost."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from support import DEMO_PROMPT, DEMO_TOOLS, FIXTURES, Harness, ids_of, make_harness

from durable_harness.harness.crash import CRASH_EXIT_CODE


def one_line_error(out: object, *needles: str) -> None:
    err = out.stderr.strip()  # type: ignore[attr-defined]
    assert out.returncode == 2, err  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1, err
    assert err.startswith("durable-harness: error: ")
    for needle in needles:
        assert needle in err, err


def no_turns(h: Harness) -> None:
    out = h.cli("ls", "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == []


def test_tool_without_replay_label(demo_harness: Harness) -> None:
    out = demo_harness.cli("run", "--tools", f"{FIXTURES / 'bad_tools.py'}:UNLABELLED", "hi")
    one_line_error(out, "send_email", "replay")
    no_turns(demo_harness)


def test_tools_attribute_not_a_list(demo_harness: Harness) -> None:
    out = demo_harness.cli("run", "--tools", f"{FIXTURES / 'bad_tools.py'}:NOT_A_LIST", "hi")
    one_line_error(out, "NOT_A_LIST", "list of tools")


def test_tool_names_must_not_collide(demo_harness: Harness, tmp_path: Path) -> None:
    """A tool taking the name of one the agent has, or of another host tool, is refused
    (the model calls tools by name: which one ran must not depend on load order)."""
    bad = FIXTURES / "bad_tools.py"
    out = demo_harness.cli("run", "--tools", f"{bad}:WAIT_NAMED", "hi")
    one_line_error(out, "wait_for_signal", "already defined", "rename it")
    out = demo_harness.cli("run", "--tools", f"{bad}:BASH_NAMED", "hi")
    one_line_error(out, "'bash'", "already defined")
    out = demo_harness.cli("run", "--tools", f"{bad}:NOTIFY", "--tools", f"{bad}:NOTIFY", "hi")
    one_line_error(out, "'notify'", "already defined")
    # A CLI agent too (checked before the CLI is looked for: a host folder, Pi).
    (tmp_path / "ws").mkdir()
    args = ["run", "--agent", "pi", "--workspace", str(tmp_path / "ws")]
    out = demo_harness.cli(*args, "--tools", f"{bad}:WAIT_NAMED", "hi")
    one_line_error(out, "wait_for_signal", "already defined")
    no_turns(demo_harness)


def test_unreadable_tools_file(demo_harness: Harness, tmp_path: Path) -> None:
    out = demo_harness.cli("run", "--tools", f"{tmp_path / 'missing.py'}:TOOLS", "hi")
    one_line_error(out, "missing.py", "cannot read")
    broken = tmp_path / "broken.py"
    broken.write_text("def oops(:\n")
    out = demo_harness.cli("run", "--tools", f"{broken}:TOOLS", "hi")
    one_line_error(out, "broken.py", "SyntaxError")
    no_turns(demo_harness)


def test_unknown_agent(demo_harness: Harness) -> None:
    out = demo_harness.cli("run", "--agent", "hal9000", "hi")
    one_line_error(out, "unknown agent 'hal9000'", "builtin")


def test_no_api_key_for_a_real_endpoint(demo_harness: Harness) -> None:
    out = demo_harness.cli("run", "hi", ANTHROPIC_BASE_URL="https://api.example.invalid")
    one_line_error(out, "ANTHROPIC_API_KEY")
    no_turns(demo_harness)


def test_bad_setting(demo_harness: Harness) -> None:
    out = demo_harness.cli("ls", DURABLE_HARNESS_LEASE_SECONDS="soon")
    one_line_error(out, "DURABLE_HARNESS_LEASE_SECONDS")
    out = demo_harness.cli("ls", DURABLE_HARNESS_WORLD="mongodb")
    one_line_error(out, "mongodb")


def test_unknown_turn(demo_harness: Harness) -> None:
    one_line_error(demo_harness.cli("show", "turn_nope"), "turn_nope")
    one_line_error(demo_harness.cli("resume", "turn_nope"), "turn_nope")


def test_corrupt_journal_row(demo_harness: Harness) -> None:
    h = demo_harness
    crashed = h.cli(
        "run", "--tools", DEMO_TOOLS, DEMO_PROMPT, DURABLE_HARNESS_CRASH_AT="4:before_intent"
    )
    assert crashed.returncode == CRASH_EXIT_CODE
    turn_id = ids_of(crashed)["turn"]
    db = Path(h.env["DURABLE_HARNESS_DATA_DIR"]) / "world.sqlite3"
    with sqlite3.connect(db) as conn:
        good = conn.execute(
            "SELECT meta FROM steps WHERE turn_id=? AND seq=2", (turn_id,)
        ).fetchone()[0]
        conn.execute("UPDATE steps SET meta='{not json' WHERE turn_id=? AND seq=2", (turn_id,))
    one_line_error(h.cli("show", turn_id), turn_id, "2")
    resumed = h.cli("resume", turn_id, "--force")
    assert resumed.returncode != 0
    assert "corrupt" in resumed.stderr.lower() or "not valid" in resumed.stderr.lower(), (
        resumed.stderr
    )
    # Nothing was lost: the rows are all there; repair the row and the turn finishes.
    with sqlite3.connect(db) as conn:
        assert (
            conn.execute("SELECT count(*) FROM steps WHERE turn_id=?", (turn_id,)).fetchone()[0]
            == 4
        )
        conn.execute("UPDATE steps SET meta=? WHERE turn_id=? AND seq=2", (good, turn_id))
    resumed = h.cli("resume", turn_id, "--force")
    assert resumed.returncode == 0, resumed.stderr
    assert len(h.ledger_lines()) == 1


def test_workspace_cap_is_a_tool_error(tmp_path: Path) -> None:
    for h in make_harness(tmp_path, FIXTURES / "files.toml"):
        out = h.cli("run", "--max-files", "3", "write files")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "Done writing."
        turn_id = ids_of(out)["turn"]
        data = h.show(turn_id)
        assert [s["status"] for s in data["steps"]] == ["done"] * len(data["steps"])
        db = Path(h.env["DURABLE_HARNESS_DATA_DIR"]) / "world.sqlite3"
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT key, output FROM steps WHERE turn_id=? AND kind='tool' ORDER BY seq",
                (turn_id,),
            ).fetchall()
        results = {key: json.loads(output) for key, output in rows}
        errors = [r for r in results.values() if r.get("is_error")]
        # a.txt, b.txt, c.txt fit under the cap of 3 files; d.txt is refused as a tool
        # error the model sees, and the workspace still works for the next command.
        assert len(errors) == 1 and "workspace limit" in errors[0]["content"], results
        assert "--max-files" in errors[0]["content"]
        last = list(results.values())[-1]  # the `ls | wc -l` that followed
        assert last["content"].split() == ["exit", "code", "0", "3"], last
