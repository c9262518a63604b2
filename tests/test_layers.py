"""The layers' import contracts (pyproject.toml [tool.importlinter]) are live: they pass on
the tree, and a back-arrow added to a copy of it breaks them (so a contract that stopped
checking anything, after a rename, would fail here rather than pass silently)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_contracts_hold_on_the_tree() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_back_arrow_breaks_them(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "durable_harness", tmp_path / "durable_harness")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    journal = tmp_path / "durable_harness" / "harness" / "journal.py"
    text = journal.read_text()
    journal.write_text(text + "\nfrom durable_harness.runtime.worker import Worker  # noqa\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "durable_harness.harness is not allowed to import durable_harness.runtime" in done.stdout
    assert "durable_harness.harness.journal -> durable_harness.runtime.worker" in done.stdout
