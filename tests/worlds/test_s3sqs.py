"""What only the S3+SQS World promises: its fencing without transactions, its use of SQS,
and its start-up checks (each bad setting is one clear error from the real CLI).

The contract suite runs on this World through ``conftest.py``; these tests add the races
and failure modes that are particular to S3 and SQS. Servers: moto (S3 and SQS) and
SeaweedFS (a real S3 server), started by ``services_s3``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import services_s3
from support import DEMO, DEMO_PROMPT, DEMO_REPLY, DEMO_TOOLS, ids_of, make_harness

from durable_harness.core.errors import ConfigError, CorruptJournal, LeaseLost, StepConflict
from durable_harness.core.types import Lease, Step, StepStatus, TurnStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.worlds import open_world
from durable_harness.worlds.s3sqs import S3SqsWorld
from durable_harness.worlds.s3sqs import store as _s3_store
from durable_harness.worlds.s3sqs.journal import key_digest

S3_SERVERS = ["moto", "seaweedfs"]


def s3_url(server: str) -> str:
    return services_s3.moto().url if server == "moto" else services_s3.seaweedfs().url


@pytest.fixture(params=S3_SERVERS)
def options(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    with services_s3.s3sqs_env(s3_url(request.param), services_s3.moto().url) as opts:
        yield opts


@pytest.fixture
def opened(options: dict[str, Any]) -> Iterator[Callable[..., S3SqsWorld]]:
    worlds: list[S3SqsWorld] = []

    def open_(**overrides: Any) -> S3SqsWorld:
        world = open_world("s3sqs", **{**options, **overrides})
        assert isinstance(world, S3SqsWorld)
        worlds.append(world)
        return world

    yield open_
    for world in worlds:
        world.close()


def running_turn(world: S3SqsWorld, turn_id: str = "t1", lease_seconds: float = 30) -> Lease:
    world.create_session("s1")
    world.create_turn("s1", turn_id, "prompt", {})
    lease = world.claim_turn(turn_id, "w1", lease_seconds)
    assert lease is not None
    return lease


def step(lease: Lease, seq: int, key: str) -> Step:
    return Step(
        turn_id=lease.turn_id, seq=seq, key=key, kind="tool", name="n", input_hash="h",
        epoch=lease.epoch,
    )  # fmt: skip


def race(n: int, attempt: Callable[[int], None]) -> list[str]:
    """Run ``attempt(i)`` in ``n`` threads released together; each result's class name."""
    barrier = threading.Barrier(n)
    results: list[str] = [""] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            attempt(i)
            results[i] = "ok"
        except Exception as exc:
            results[i] = type(exc).__name__

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# -- races -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "seq_of, key_of",
    [
        pytest.param(lambda i: 0, lambda i: "k", id="same-seq-same-key"),
        pytest.param(lambda i: 0, lambda i: f"k{i}", id="same-seq"),
        pytest.param(lambda i: i, lambda i: "k", id="same-key"),
    ],
)
def test_sixteen_workers_create_the_same_step_exactly_one_wins(
    opened: Callable[..., S3SqsWorld],
    seq_of: Callable[[int], int],
    key_of: Callable[[int], str],
) -> None:
    lease = running_turn(opened())
    clients = [opened() for _ in range(16)]  # each its own connections, as 16 workers
    results = race(16, lambda i: clients[i].insert_intent(step(lease, seq_of(i), key_of(i))))
    print(f"\n16 concurrent inserts of one step: {dict(Counter(results))}")
    assert results.count("ok") == 1, results
    assert set(results) == {"ok", "StepConflict"}, results
    [row] = clients[0].load_steps("t1")
    winner = results.index("ok")
    assert (row.seq, row.key) == (seq_of(winner), key_of(winner))


def test_a_finish_racing_a_takeover_is_refused(opened: Callable[..., S3SqsWorld]) -> None:
    """The zombie reads the row and the turn (both fine), then another worker takes the
    turn over before the zombie's If-Match lands: the seal makes that write fail."""
    zombie, other = opened(), opened()
    old = running_turn(zombie)
    zombie.insert_intent(step(old, 0, "k0"))
    real_fence = zombie._journal.fence
    taken: list[Lease] = []

    def fence_then_taken_over(turn_id: str, epoch: int) -> Any:
        doc = real_fence(turn_id, epoch)
        if not taken:
            lease = other.claim_turn(turn_id, "w2", 30, force=True)
            assert lease is not None
            taken.append(lease)
        return doc

    zombie._journal.fence = fence_then_taken_over  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        zombie.finish_step("t1", 0, old.epoch, StepStatus.DONE, '"late"', None, {})
    [row] = other.load_steps("t1")
    assert row.status == StepStatus.INTENT and row.output is None
    other.finish_step("t1", 0, taken[0].epoch, StepStatus.DONE, '"new"', None, {})
    assert other.load_steps("t1")[0].output == '"new"'


def test_an_intent_racing_a_takeover_is_refused_before_the_call(
    opened: Callable[..., S3SqsWorld],
) -> None:
    """The takeover lands between the zombie's epoch check and its row: the row is
    written, but the zombie's re-read refuses (its call never runs) and the new owner
    sees an interrupted intent it may restart."""
    zombie, other = opened(), opened()
    old = running_turn(zombie)
    real_fence = zombie._journal.fence
    taken: list[Lease] = []

    def fence_then_taken_over(turn_id: str, epoch: int) -> Any:
        doc = real_fence(turn_id, epoch)
        if not taken:
            lease = other.claim_turn(turn_id, "w2", 30, force=True)
            assert lease is not None
            taken.append(lease)
        return doc

    zombie._journal.fence = fence_then_taken_over  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        zombie.insert_intent(step(old, 0, "k0"))
    [row] = other.load_steps("t1")
    assert row.status == StepStatus.INTENT and row.epoch == old.epoch
    assert other.restart_intent("t1", 0, taken[0].epoch) == 2
    with pytest.raises(LeaseLost):
        zombie._journal.fence = real_fence  # type: ignore[method-assign]
        zombie.finish_step("t1", 0, old.epoch, StepStatus.DONE, '"late"', None, {})


def test_a_stale_key_marker_of_a_fenced_writer_is_voided(
    opened: Callable[..., S3SqsWorld],
) -> None:
    """A zombie wrote its key marker but not its row: the new owner takes the key at
    another seq and voids the zombie's seq, so the zombie's row can never appear."""
    world = opened()
    old = running_turn(world)
    store, layout = world._store, world._layout
    marker = layout.key_marker("t1", key_digest("k"))
    store.put(marker, {"seq": 5, "epoch": old.epoch, "key": "k"}, if_none_match=True)
    new = world.claim_turn("t1", "w2", 30, force=True)
    assert new is not None
    world.insert_intent(step(new, 0, "k"))
    with pytest.raises(_s3_store.Precondition):  # the zombie's row would duplicate key k
        store.put(layout.step("t1", 5), {"seq": 5, "key": "k"}, if_none_match=True)
    with pytest.raises(StepConflict):
        world.insert_intent(step(new, 1, "k"))
    assert [(s.seq, s.key) for s in world.load_steps("t1")] == [(0, "k")]
    world.insert_intent(step(new, 5, "k5"))  # the void seq is free for the owner's own step
    assert [(s.seq, s.key) for s in world.load_steps("t1")] == [(0, "k"), (5, "k5")]


def test_a_write_whose_response_was_lost_is_recognised_as_ours(
    opened: Callable[..., S3SqsWorld], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened()._store
    monkeypatch.setattr(_s3_store, "new_write_id", lambda: "same-write")
    first = store.put("scratch/doc", {"n": 1}, if_none_match=True)
    again = store.put("scratch/doc", {"n": 1}, if_none_match=True)  # botocore's retry
    assert again.data == first.data
    monkeypatch.setattr(_s3_store, "new_write_id", lambda: "another-write")
    with pytest.raises(_s3_store.Precondition):
        store.put("scratch/doc", {"n": 2}, if_none_match=True)


# -- the queue -------------------------------------------------------------------------
def queue_depth(world: S3SqsWorld, url: str | None = None) -> int:
    attributes = world._sqs.get_queue_attributes(
        QueueUrl=url or world._queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def visible_and_hidden(world: S3SqsWorld) -> tuple[int, int]:
    attributes = world._sqs.get_queue_attributes(
        QueueUrl=world._queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def test_the_message_follows_a_claim_turn_lease_and_goes_with_the_turn(
    opened: Callable[..., S3SqsWorld],
) -> None:
    """``claim_turn`` takes no message; the first worker that receives it hides it until
    the lease ends and hands its receipt to the holder (in the turn object), whose renewals
    then move the message and whose completion deletes it."""
    holder, other = opened(), opened()
    lease = running_turn(holder, lease_seconds=2)
    assert visible_and_hidden(holder) == (1, 0)
    assert other.claim("w2", 30) is None
    assert visible_and_hidden(holder) == (0, 1)
    assert holder._store.get(holder._layout.turn("t1")).data["receipt"]  # type: ignore[union-attr]
    holder.renew(lease, 30)
    time.sleep(2.5)  # past the hide of the first receive: only the renewal keeps it hidden
    assert visible_and_hidden(holder) == (0, 1)
    assert other.claim("w2", 30) is None
    holder.complete_turn(lease, "done")
    assert visible_and_hidden(holder) == (0, 0)


def test_completing_deletes_the_message(opened: Callable[..., S3SqsWorld]) -> None:
    world = opened()
    world.create_session("s1")
    world.create_turn("s1", "t1", "p", {})
    lease = world.claim("w", 30)
    assert lease is not None and lease.receipt
    world.complete_turn(lease, "done")
    assert queue_depth(world) == 0


def test_a_turn_the_redrive_policy_dead_lettered_is_marked_failed(
    opened: Callable[..., S3SqsWorld],
) -> None:
    # The same servers; a queue whose redrive policy gives up after one receive.
    env = services_s3.aws_env(os.environ["AWS_ENDPOINT_URL_S3"], os.environ["AWS_ENDPOINT_URL_SQS"])
    bucket, queue_url, dead = services_s3.make_bucket_and_queue(env, max_receive_count=1)
    world = opened(bucket=bucket, queue_url=queue_url)
    world.create_session("s1")
    world.create_turn("s1", "t1", "p", {})
    sqs = world._sqs
    for _ in range(2):  # a consumer that keeps dying before it can claim anything
        sqs.receive_message(QueueUrl=queue_url, VisibilityTimeout=0)
    assert world.claim("w", 30) is None
    turn = world.get_turn("t1")
    assert turn.status == TurnStatus.FAILED
    assert turn.error is not None and "dead-lettered by SQS" in turn.error, turn.error
    assert queue_depth(world, dead) == 0


def test_a_message_received_often_is_replaced_before_the_redrive_takes_it(
    opened: Callable[..., S3SqsWorld],
) -> None:
    env = services_s3.aws_env(os.environ["AWS_ENDPOINT_URL_S3"], os.environ["AWS_ENDPOINT_URL_SQS"])
    bucket, queue_url, dead = services_s3.make_bucket_and_queue(env, max_receive_count=4)
    holder, other = (
        opened(bucket=bucket, queue_url=queue_url),
        opened(bucket=bucket, queue_url=queue_url),
    )
    lease = running_turn(holder)  # a live 30 s lease: receivers only hide the message again
    for _ in range(6):  # 12 receives in all: thrice the redrive policy's limit
        holder._sqs.receive_message(QueueUrl=queue_url, VisibilityTimeout=0)
        assert other.claim("w2", 30) is None
    assert queue_depth(holder, dead) == 0
    assert holder.get_turn("t1").status == TurnStatus.RUNNING
    holder.complete_turn(lease, "done")
    assert other.claim("w2", 30) is None
    assert queue_depth(holder) == 0


def test_a_message_without_a_turn_is_kept_a_while_then_deleted(
    opened: Callable[..., S3SqsWorld], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = opened()
    world._queue.send("t-never-created", "s1", "token")
    monkeypatch.setattr("durable_harness.worlds.s3sqs.queue.ORPHAN_RECHECK", 0.0)
    assert world.claim("w", 30) is None  # its create_turn may still be writing the turn
    assert queue_depth(world) == 1
    monkeypatch.setattr("durable_harness.worlds.s3sqs.queue.ORPHAN_GRACE", 0.0)
    assert world.claim("w", 30) is None
    assert queue_depth(world) == 0


# -- stored data -----------------------------------------------------------------------
def test_a_corrupt_turn_object_is_corrupt_journal(opened: Callable[..., S3SqsWorld]) -> None:
    world = opened()
    running_turn(world)
    world._store.put_bytes(world._layout.turn("t1"), b"{not json")
    with pytest.raises(CorruptJournal, match="t1"):
        world.get_turn("t1")


def test_a_signal_of_an_older_world_is_the_first_of_its_name(
    opened: Callable[..., S3SqsWorld],
) -> None:
    world = opened()
    running_turn(world)
    # What an older World wrote: one object per name, no delivery id, at the same key.
    older = b'{"payload": "{\\"status\\": \\"failed\\"}", "received_at": 0, "write_id": "w"}'
    world._store.put_bytes(world._layout.signal("t1", "ci"), older)
    [old] = world.list_signals("t1", "ci")
    assert (old.index, old.payload, old.delivery_id) == (0, '{"status": "failed"}', "legacy")
    assert world.send_signal("t1", "ci", '{"status": "passed"}') is True
    assert [s.index for s in world.list_signals("t1", "ci")] == [0, 1]
    assert world.claim_signal("t1", "ci", 0, seq=2) is True


def test_the_url_form_names_bucket_prefix_and_queue(options: dict[str, Any]) -> None:
    url = f"s3sqs://{options['bucket']}/team-a?queue={options['queue_url']}"
    with open_world(url) as world:
        assert isinstance(world, S3SqsWorld)
        world.create_session("s1")
        assert world._layout.session("s1").startswith("team-a/")


# -- bad input, through the real CLI ---------------------------------------------------
def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, err, out.stdout)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("durable-harness: error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def good_env() -> dict[str, str]:
    url = services_s3.moto().url
    env = services_s3.aws_env(url, url)
    bucket, queue_url, _ = services_s3.make_bucket_and_queue(env)
    return {
        **os.environ,
        **env,
        "DURABLE_HARNESS_WORLD": "s3sqs",
        "DURABLE_HARNESS_S3_BUCKET": bucket,
        "DURABLE_HARNESS_SQS_QUEUE_URL": queue_url,
    }


def test_good_settings_work_and_doctor_says_so(good_env: dict[str, str]) -> None:
    out = cli("ls", **good_env)
    assert out.returncode == 0, out.stderr
    out = cli("doctor", **good_env)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("s3 bucket and credentials", "sqs queue", "conditional writes", "redrive"):
        assert f"[ok] {name}" in out.stdout, out.stdout


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_missing_settings(good_env: dict[str, str], command: str) -> None:
    env = {k: v for k, v in good_env.items() if k != "DURABLE_HARNESS_S3_BUCKET"}
    one_line_error(cli(command, **env), "DURABLE_HARNESS_S3_BUCKET")
    env = {k: v for k, v in good_env.items() if k != "DURABLE_HARNESS_SQS_QUEUE_URL"}
    one_line_error(cli(command, **env), "DURABLE_HARNESS_SQS_QUEUE_URL")


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_missing_bucket(good_env: dict[str, str], command: str) -> None:
    out = cli(command, **{**good_env, "DURABLE_HARNESS_S3_BUCKET": "no-such-bucket-here"})
    one_line_error(out, "no-such-bucket-here", "does not exist", "DURABLE_HARNESS_S3_BUCKET")


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_missing_queue(good_env: dict[str, str], command: str) -> None:
    url = good_env["DURABLE_HARNESS_SQS_QUEUE_URL"] + "-gone"
    out = cli(command, **{**good_env, "DURABLE_HARNESS_SQS_QUEUE_URL": url})
    one_line_error(out, url, "does not exist", "DURABLE_HARNESS_SQS_QUEUE_URL")


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_wrong_credentials(good_env: dict[str, str], command: str) -> None:
    # moto accepts any credentials; SeaweedFS checks SigV4 signatures as AWS does.
    env = services_s3.aws_env(services_s3.seaweedfs().url, services_s3.moto().url)
    bucket, queue_url, _ = services_s3.make_bucket_and_queue(env)
    bad = {
        **good_env,
        **env,
        "DURABLE_HARNESS_S3_BUCKET": bucket,
        "DURABLE_HARNESS_SQS_QUEUE_URL": queue_url,
        "AWS_SECRET_ACCESS_KEY": "not-the-secret",
    }
    one_line_error(cli(command, **bad), "credentials were rejected", "AWS_SECRET_ACCESS_KEY")


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_unreachable_endpoint(good_env: dict[str, str], command: str) -> None:
    out = cli(command, **{**good_env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"})
    one_line_error(out, "cannot reach S3", "127.0.0.1:9")


@pytest.mark.parametrize("command", ["ls", "doctor"])
def test_an_s3_server_without_conditional_writes_is_refused(
    good_env: dict[str, str], command: str
) -> None:
    """A real server (moto) behind a proxy that drops If-None-Match and If-Match: what a
    non-conforming S3-compatible server does with them."""
    with services_s3.NoConditionalWritesProxy(services_s3.moto().port) as proxy:
        out = cli(command, **{**good_env, "AWS_ENDPOINT_URL_S3": proxy.url})
    one_line_error(out, "ignores conditional writes", "If-None-Match")


def test_the_conditional_write_check_refuses_in_process_too() -> None:
    url = services_s3.moto().url
    env = services_s3.aws_env(url, url)
    bucket, queue_url, _ = services_s3.make_bucket_and_queue(env)
    with services_s3.NoConditionalWritesProxy(services_s3.moto().port) as proxy:
        with (
            services_s3.patched_environ({**env, "AWS_ENDPOINT_URL_S3": proxy.url}),
            pytest.raises(ConfigError, match="ignores conditional writes"),
        ):
            S3SqsWorld(bucket, queue_url)
        with services_s3.patched_environ(env):  # the same bucket, straight to the server
            S3SqsWorld(bucket, queue_url).close()


# -- a crashed turn resumed through the CLI --------------------------------------------
def test_a_crashed_turn_is_finished_by_a_worker(tmp_path: Path, good_env: dict[str, str]) -> None:
    for h in make_harness(tmp_path, DEMO / "script.toml"):
        h.env.update({k: v for k, v in good_env.items() if k.startswith(("AWS_", "DURABLE_"))})
        crash = "3:after_run"  # the `never` refund ran; its outcome was not recorded
        crashed = h.cli("run", "--tools", DEMO_TOOLS, DEMO_PROMPT, DURABLE_HARNESS_CRASH_AT=crash)
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        turn_id = ids_of(crashed)["turn"]
        worker = h.cli("worker", "--until-idle")
        assert worker.returncode == 0, worker.stderr
        data = h.show(turn_id)
        assert data["turn"]["status"] == "done" and data["turn"]["result"] == DEMO_REPLY
        assert len(h.ledger_lines()) == 1  # the `never` refund ran once
        assert h.repeated_requests() == {}
        assert json.loads(cli("ls", "--json", **h.env).stdout)[0]["turn_id"] == turn_id
