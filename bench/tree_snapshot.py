"""The cost of snapshotting a big host folder (a host-folder workspace saves one per step).

Builds a tree of ``--files`` files totalling ``--mb`` MB (plus a few links and empty
folders), then times, in this process:

* ``cold``: the first ``read_tree`` (every file read);
* ``warm``: a ``read_tree`` with the cache of the first, nothing changed (only stat);
* ``one change``: the same after one file was rewritten;
* ``save``: :meth:`SnapshotStore.save` of the warm state into a local World whose blob
  store already holds every file (the per-step case: hashing, no blob written), and the
  first save (every blob written).

Run: ``python bench/tree_snapshot.py [--mb 100] [--files 5000]``; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from durable_harness.core.tree import RACY_SECONDS, TreeCache, read_tree
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.worlds import open_world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--files", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        size = args.mb * 1024 * 1024 // args.files
        for i in range(args.files):
            folder = root / f"d{i % 100}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{i}").write_bytes(os.urandom(size))
        for i in range(10):
            (root / f"empty{i}").mkdir()
            (root / f"link{i}").symlink_to(f"d{i}/f{i}")
        time.sleep(RACY_SECONDS * 2)
        cache = TreeCache()
        figures: dict[str, float] = {}

        def timed(name: str) -> object:
            start = time.perf_counter()
            state = read_tree(root, cache=cache)
            figures[name] = round(time.perf_counter() - start, 3)
            return state

        timed("cold_s")
        state = timed("warm_s")
        (root / "d1" / "f1").write_bytes(os.urandom(size))
        timed("one_change_s")
        with open_world("local", data_dir=Path(tmp) / "world") as world:
            store = SnapshotStore(world)
            start = time.perf_counter()
            store.save(state)  # type: ignore[arg-type]
            figures["first_save_s"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            store.save(state)  # type: ignore[arg-type]
            figures["step_save_s"] = round(time.perf_counter() - start, 3)
        figures.update(mb=args.mb, files=args.files)
        for name, value in figures.items():
            print(f"{name:>14}: {value}")
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
