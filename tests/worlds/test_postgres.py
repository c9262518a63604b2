"""What only the PostgreSQL World promises: migrations, connection errors, wake-ups,
reconnection after a server restart, retries after a lost commit, and fencing under
concurrency. The World contract itself is tests/worlds/test_contract.py."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from postgres_server import PASSWORD, PostgresServer, free_port

from durable_harness.core.errors import (
    ConfigError,
    CorruptJournal,
    LeaseLost,
    NotFound,
    StepConflict,
    WorldError,
)
from durable_harness.core.types import Event, Lease, Step, StepStatus, TurnStatus
from durable_harness.worlds import open_world, postgres
from durable_harness.worlds.postgres import PostgresWorld
from durable_harness.worlds.postgres.schema import MIGRATIONS


@pytest.fixture
def url(postgres: PostgresServer) -> Iterator[str]:
    with postgres.database() as url:
        yield url


@pytest.fixture
def world(url: str) -> Iterator[PostgresWorld]:
    with PostgresWorld(url) as world:
        yield world


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def claimed(world: PostgresWorld, turn_id: str = "t1") -> Lease:
    world.create_session("s1")
    world.create_turn("s1", turn_id, "hi", {})
    lease = world.claim_turn(turn_id, "w1", 30)
    assert lease is not None
    return lease


def step(lease: Lease, seq: int = 0) -> Step:
    return Step(
        turn_id=lease.turn_id,
        seq=seq,
        key=f"k{seq}",
        kind="tool",
        name="n",
        input_hash="h",
        epoch=lease.epoch,
    )


# -- opening: URL, migrations, errors ---------------------------------------------------
def test_open_world_by_name_and_by_url(url: str) -> None:
    with open_world("postgres", url=url, max_attempts=3) as world:
        assert isinstance(world, PostgresWorld) and world.max_attempts == 3
    with open_world(url) as world:
        assert isinstance(world, PostgresWorld)
    with pytest.raises(ConfigError, match="DURABLE_HARNESS_POSTGRES_URL"):
        open_world("postgres")
    with pytest.raises(ConfigError, match="unknown option"):
        open_world("postgres", url=url, data_dir="/tmp")


def test_migrations_are_recorded_and_applied_once(url: str) -> None:
    PostgresWorld(url).close()
    PostgresWorld(url).close()
    with raw(url) as conn:
        rows = conn.execute("SELECT version, name FROM durable_harness.schema_version").fetchall()
    assert rows == [(n, name) for n, (name, _) in enumerate(MIGRATIONS, start=1)]


@contextlib.contextmanager
def older_world(url: str, version: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresWorld]:
    """A World made by a durable-harness whose schema ended at ``version``: today's code
    with only the first ``version`` migrations (what it writes there, an older one wrote).
    Today's claims record their holder, so the jobs table gets that one nullable column
    (its migration adds it only if missing)."""
    with monkeypatch.context() as patched:
        patched.setattr(postgres.schema, "MIGRATIONS", MIGRATIONS[:version])
        with PostgresWorld(url) as world:
            assert world.schema_version == version
            with raw(url) as conn:
                conn.execute(
                    "ALTER TABLE durable_harness.jobs ADD COLUMN IF NOT EXISTS holder_key bigint"
                )
            yield world


def test_a_signal_of_an_older_world_becomes_the_first_of_its_name(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with older_world(url, 1, monkeypatch) as world:  # one signal per name
        claimed(world)
    with raw(url) as conn:
        conn.execute(
            "INSERT INTO durable_harness.signals VALUES ('t1', 'ci', '{\"status\": \"failed\"}', 0)"
        )
    with PostgresWorld(url) as world:
        assert world.get_signal("t1", "ci") == '{"status": "failed"}'
        [old] = world.list_signals("t1", "ci")
        assert (old.index, old.delivery_id, old.claimed_by) == (0, "legacy", None)
        assert world.send_signal("t1", "ci", '{"status": "passed"}') is True
        assert [s.index for s in world.list_signals("t1", "ci")] == [0, 1]


def test_turns_of_a_world_before_the_event_log_get_events_and_can_be_cancelled(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with older_world(url, 2, monkeypatch) as world:
        world.create_session("s1")
        for turn_id in ("done", "running", "queued"):
            world.create_turn("s1", turn_id, "hi", {})
        finished = world.claim_turn("done", "w1", 30)
        assert finished is not None
        world.complete_turn(finished, "ok")
        lease = world.claim_turn("running", "w1", 30)
        assert lease is not None
        world.insert_intent(step(lease, 0))
    with PostgresWorld(url) as world:
        assert world.schema_version == len(MIGRATIONS)
        assert {c.name: c.ok for c in world.doctor()}["schema"]
        # The running turn's worker keeps its lease: its fenced appends land, a zombie's not.
        assert world.append_event("running", "a", "k", {}, epoch=lease.epoch).seq == 1
        with pytest.raises(LeaseLost):
            world.append_event("running", "b", "k", {}, epoch=lease.epoch - 1)
        world.cancel_turn(lease, "stopped")
        cancelled = world.get_turn("running")
        assert (cancelled.status, cancelled.error) == (TurnStatus.CANCELLED, "stopped")
        assert [s.seq for s in world.load_steps("running")] == [0]
        # A turn that ended before the migration: serve reconciles its log.
        assert world.append_event("done", "turn:ended", "turn.ended", {}).seq == 1
        assert world.get_turn("done").result == "ok"
        claim = world.claim("w2", 30)
        assert claim is not None and claim.turn_id == "queued"
        assert world.claim("w2", 30) is None  # the cancelled turn is not delivered again
        world.put_owner("turn", "queued", "acme", 1.0)
        assert world.list_owned("acme", "turn") == [(1.0, "queued")]
        assert world.take_rate("acme", 1, 60) is True
    with raw(url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE durable_harness.turns SET status = 'halfway'")


def test_workers_starting_at_once_migrate_once(url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        try:
            barrier.wait()
            PostgresWorld(url).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with raw(url) as conn:
        count = conn.execute("SELECT count(*) FROM durable_harness.schema_version").fetchone()
    assert count == (len(MIGRATIONS),)


def test_a_newer_schema_is_refused(url: str) -> None:
    PostgresWorld(url).close()
    with raw(url) as conn:
        conn.execute(
            "INSERT INTO durable_harness.schema_version VALUES (999, 'from the future', 0)"
        )
    with pytest.raises(WorldError, match=r"schema version 999.*upgrade durable-harness"):
        PostgresWorld(url)


@pytest.mark.parametrize(
    ("make_url", "error", "message"),
    [
        pytest.param(
            lambda pg: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/x",
            WorldError,
            r"cannot reach PostgreSQL at 127\.0\.0\.1:\d+: Connection refused.*check "
            "DURABLE_HARNESS_POSTGRES_URL",
            id="unreachable",
        ),
        pytest.param(
            lambda pg: pg.url(password="wrong-password"),
            ConfigError,
            "refused user postgres: password authentication failed",
            id="wrong-password",
        ),
        pytest.param(
            lambda pg: pg.url("no_such_db"),
            ConfigError,
            "database no_such_db does not exist.*createdb no_such_db",
            id="missing-database",
        ),
        pytest.param(
            lambda pg: pg.url().replace("postgres:", "nobody:", 1),
            ConfigError,
            "refused user nobody",
            id="unknown-user",
        ),
        pytest.param(
            lambda pg: "postgresql://postgres:wrong-password@127.0.0.1:5432/x?bogus=1",
            ConfigError,
            "not a valid PostgreSQL URL",
            id="bad-url",
        ),
    ],
)
def test_connection_errors_say_what_to_do(
    postgres: PostgresServer, make_url: Callable[[PostgresServer], str], error: type, message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        PostgresWorld(make_url(postgres))
    assert "wrong-password" not in str(caught.value) and PASSWORD not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_user_who_may_not_create_the_schema_is_told_how_to_fix_it(
    postgres: PostgresServer, url: str
) -> None:
    dbname = url.rsplit("/", 1)[1]
    postgres.admin("DROP ROLE IF EXISTS dh_reader")
    postgres.admin(f"CREATE ROLE dh_reader LOGIN PASSWORD '{PASSWORD}'")
    try:
        postgres.admin(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC')
        reader = url.replace("postgres:", "dh_reader:", 1)
        with pytest.raises(ConfigError, match=f"GRANT CREATE ON DATABASE {dbname} TO dh_reader"):
            PostgresWorld(reader)
        # Once the owner created it, the user may open it; doctor names what is missing.
        PostgresWorld(url).close()
        postgres.admin("GRANT USAGE ON SCHEMA durable_harness TO dh_reader", dbname=dbname)
        postgres.admin(
            "GRANT SELECT ON ALL TABLES IN SCHEMA durable_harness TO dh_reader", dbname=dbname
        )
        with PostgresWorld(reader) as world:
            checks = {c.name: c for c in world.doctor()}
        assert checks["schema"].ok and not checks["permissions"].ok
        assert "GRANT SELECT, INSERT, UPDATE, DELETE" in checks["permissions"].detail
    finally:
        postgres.admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        postgres.admin("DROP ROLE IF EXISTS dh_reader")


def test_doctor_on_a_healthy_world(world: PostgresWorld) -> None:
    checks = world.doctor()
    assert all(c.ok for c in checks), checks
    names = [c.name for c in checks]
    assert names[:6] == ["server", "schema", "permissions", "queue", "notify", "blobs"]


# -- rows the World cannot decode ---------------------------------------------------------
def test_bad_rows_are_corrupt_journal(world: PostgresWorld, url: str) -> None:
    lease = claimed(world)
    world.insert_intent(step(lease))
    digest = world.put_blob(b"payload")
    with raw(url) as conn:
        conn.execute("UPDATE durable_harness.steps SET status = 'halfway'")
        with pytest.raises(CorruptJournal, match=r"turn t1 step 0.*halfway"):
            world.load_steps("t1")
        conn.execute("UPDATE durable_harness.steps SET status = 'intent', meta = '[1]'")
        with pytest.raises(CorruptJournal, match="turn t1 step 0"):
            world.load_steps("t1")
        conn.execute("UPDATE durable_harness.turns SET config = '\"x\"'")
        with pytest.raises(CorruptJournal, match="turn t1"):
            world.get_turn("t1")
        conn.execute("UPDATE durable_harness.blobs SET data = 'tampered'")
        with pytest.raises(CorruptJournal, match=digest):
            world.get_blob(digest)
    with pytest.raises(NotFound):
        world.get_blob("../../etc/passwd")


def test_event_data_keeps_what_jsonb_cannot_and_a_bad_row_is_corrupt(
    world: PostgresWorld, url: str
) -> None:
    """A model's streamed text may hold NUL or half a surrogate pair: the log keeps it."""
    claimed(world)
    data = {"text": "a\x00b\ud83dc"}
    world.append_event("t1", "a", "text.delta", data)
    assert world.read_events("t1")[0].data == data
    with raw(url) as conn:
        conn.execute("UPDATE durable_harness.events SET data = '[1]'")
        with pytest.raises(CorruptJournal, match="turn t1 event 1"):
            world.read_events("t1")
        conn.execute("UPDATE durable_harness.events SET data = 'not json'")
        with pytest.raises(CorruptJournal, match="turn t1 event 1"):
            world.append_event("t1", "a", "text.delta", data)  # the known key, read back


# -- wake-ups -------------------------------------------------------------------------------
def timed_wait(world: PostgresWorld, timeout: float) -> float:
    started = time.monotonic()
    world.wait_for_work(timeout)
    return time.monotonic() - started


def test_wait_for_work_wakes_on_create_enqueue_and_release(url: str) -> None:
    def woken_by(write: Callable[[], object]) -> float:
        timer = threading.Timer(0.2, write)
        timer.start()
        woke = timed_wait(idle, 5.0)
        timer.join()
        return woke

    with PostgresWorld(url) as idle, PostgresWorld(url) as other:
        assert timed_wait(idle, 5.0) < 0.5  # the first call starts listening and returns
        assert 0.25 <= timed_wait(idle, 0.3) < 1.0  # nothing happened: the timeout
        other.create_session("s1")
        # Each wake-up follows the write (0.2 s in) at once, not the 5 s timeout.
        assert 0.15 < woken_by(lambda: other.create_turn("s1", "t1", "hi", {})) < 0.5
        lease = idle.claim("w", 30)
        assert lease is not None
        assert 0.15 < woken_by(lambda: other.release(lease)) < 0.5
        assert idle.claim("w", 30) is not None
        other.create_turn("s1", "t2", "later", {})
        other.enqueue("t2", delay=60)
        idle.wait_for_work(0.1)  # takes in those two notifications
        assert 0.15 < woken_by(lambda: other.enqueue("t2")) < 0.5


def test_wait_for_work_sleeps_until_a_lease_runs_out(world: PostgresWorld) -> None:
    """A lease's end sends no notification; the wait ends with it, not at the timeout."""
    world.wait_for_work(0)
    lease = claimed(world)
    world.wait_for_work(0.05)  # takes in the notification of the turn's creation
    world.renew(lease, 0.5)
    woke = timed_wait(world, 10.0)
    assert 0.3 < woke < 1.0, woke
    again = world.claim("w2", 30)
    assert again is not None and again.epoch == lease.epoch + 1


def test_wait_for_work_survives_a_server_restart() -> None:
    with PostgresServer() as pg, PostgresWorld(pg.url()) as world:
        world.wait_for_work(0.1)
        pg.restart()
        world.wait_for_work(0.1)  # notices the dead listener, listens again
        world.wait_for_work(0.1)
        world.create_session("s1")
        timer = threading.Timer(0.2, lambda: world.create_turn("s1", "t1", "hi", {}))
        timer.start()
        woke = timed_wait(world, 5.0)
        timer.join()
        assert woke < 1.0, woke


def timed_wait_for_events(world: PostgresWorld, timeout: float) -> float:
    started = time.monotonic()
    world.wait_for_events(timeout)
    return time.monotonic() - started


def test_wait_for_events_wakes_every_waiter_and_only_on_events(url: str) -> None:
    """serve follows turns from many threads: one append wakes all of them at once. Events
    and new work have channels of their own: neither wakes the other's waiters."""
    with PostgresWorld(url) as idle, PostgresWorld(url) as other:
        idle.wait_for_events(5.0)  # starts listening
        idle.wait_for_work(5.0)
        lease = claimed(other)  # a running turn: no job is due for 30 s
        idle.wait_for_work(0.1)  # takes in the turn's creation
        woke: list[float] = []
        appending: list[float] = []

        def waiter() -> None:
            idle.wait_for_events(5.0)  # a thread's first call returns at once
            idle.wait_for_events(5.0)
            woke.append(time.monotonic())

        def append() -> None:
            appending.append(time.monotonic())
            other.append_event("t1", "a", "k", {})

        threads = [threading.Thread(target=waiter) for _ in range(3)]
        for thread in threads:
            thread.start()
        timer = threading.Timer(0.3, append)
        timer.start()
        assert 0.25 <= timed_wait(idle, 0.6) < 1.5  # an event is not work
        for thread in [*threads, timer]:
            thread.join()
        # Each waiter slept until the append, and woke with it, not at its timeout.
        assert len(woke) == 3 and all(0 < w - appending[0] < 1.0 for w in woke), woke
        # This thread read nothing before that append and has not waited since: the
        # notification the others took in is news to it too.
        assert timed_wait_for_events(idle, 5.0) < 0.5
        timer = threading.Timer(0.2, lambda: other.release(lease))
        timer.start()
        assert 0.55 <= timed_wait_for_events(idle, 0.6) < 1.5  # work is not an event
        timer.join()


# -- reconnection and lost commits ----------------------------------------------------------
def test_every_operation_reconnects_after_a_server_restart() -> None:
    with PostgresServer() as pg, PostgresWorld(pg.url()) as world:
        lease = claimed(world)
        world.insert_intent(step(lease, 0))
        pg.restart()  # every pooled connection is now dead
        world.finish_step("t1", 0, lease.epoch, StepStatus.DONE, '"ok"', None, {})
        lease = world.renew(lease, 30)
        world.insert_intent(step(lease, 1))
        pg.restart()
        assert [s.status for s in world.load_steps("t1")] == [StepStatus.DONE, StepStatus.INTENT]
        world.append_event("t1", "a", "k", {}, epoch=lease.epoch)
        pg.restart()
        assert world.append_event("t1", "b", "k", {}).seq == 2
        assert world.take_rate("b", 1, 60) is True
        world.complete_turn(lease, "done")
        assert world.get_turn("t1").status is TurnStatus.DONE


def test_an_outage_longer_than_the_retry_window_is_a_world_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres.connections, "RECONNECT_SECONDS", 1.0)
    pg = PostgresServer().start()
    try:
        world = PostgresWorld(pg.url())
        pg.stop()
        started = time.monotonic()
        with pytest.raises(WorldError, match="did not come back within 1s"):
            world.list_turns()
        assert time.monotonic() - started < 15
    finally:
        pg.stop()


class LoseReplyOnce:
    """Runs a statement for real (it commits), then fails as if the connection had died
    before the reply arrived: the ambiguous case a retry must get right."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, statement: str) -> None:
        self.statement = statement
        self.lost = 0
        real = postgres.connections.one_row

        def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
            row = real(conn, query, params)
            if query == self.statement and not self.lost:
                self.lost += 1
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return row

        monkeypatch.setattr(postgres.connections, "one_row", one)


def test_a_retried_intent_whose_first_try_committed_is_not_a_conflict(
    world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = claimed(world)
    lost = LoseReplyOnce(monkeypatch, postgres.sql.INSERT_INTENT)
    world.insert_intent(step(lease, 0))
    assert lost.lost == 1
    [recorded] = world.load_steps("t1")
    assert recorded.seq == 0 and recorded.attempts == 1
    with pytest.raises(StepConflict):  # without a lost reply, a duplicate still conflicts
        world.insert_intent(step(lease, 0))


@pytest.mark.parametrize(
    ("statement", "write"),
    [
        pytest.param(
            postgres.sql.FINISH_STEP,
            lambda w, lease: w.finish_step("t1", 0, lease.epoch, StepStatus.DONE, "1", None, {}),
            id="finish_step",
        ),
        pytest.param(
            postgres.sql.FINISH_TURN, lambda w, lease: w.complete_turn(lease, "r"), id="complete"
        ),
        pytest.param(postgres.sql.RELEASE, lambda w, lease: w.release(lease), id="release"),
    ],
)
def test_a_retried_write_whose_first_try_committed_succeeds(
    world: PostgresWorld,
    monkeypatch: pytest.MonkeyPatch,
    statement: str,
    write: Callable[[PostgresWorld, Lease], None],
) -> None:
    lease = claimed(world)
    world.insert_intent(step(lease, 0))
    lost = LoseReplyOnce(monkeypatch, statement)
    write(world, lease)
    assert lost.lost == 1
    with pytest.raises((StepConflict, LeaseLost)):  # a real second write is still refused
        write(world, lease)


# -- fencing under concurrency ----------------------------------------------------------------
@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda w, lease: w.insert_intent(step(lease, 0)), id="intent"),
        pytest.param(lambda w, lease: w.append_event("t1", "a", "k", {}, lease.epoch), id="event"),
    ],
)
def test_a_stale_write_waiting_on_a_claim_rechecks_the_new_epoch(
    world: PostgresWorld, url: str, write: Callable[[PostgresWorld, Lease], object]
) -> None:
    """A claim in flight holds the job row; a zombie's intent (or event) waits for it, then
    sees the epoch the claim committed and is refused, instead of slipping in on the old
    one."""
    lease = claimed(world)
    outcome: list[BaseException | None] = []
    with raw(url) as conn, conn.transaction():
        conn.execute(
            "UPDATE durable_harness.jobs SET epoch = epoch + 1, lease_owner = 'w2'"
            " WHERE turn_id = 't1'"
        )

        def zombie() -> None:
            try:
                write(world, lease)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=zombie)
        thread.start()
        time.sleep(0.3)
        assert outcome == []  # blocked on the claim's row lock
    thread.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost), outcome
    assert world.load_steps("t1") == [] and world.read_events("t1") == []


def test_an_append_of_a_key_committed_meanwhile_returns_it_and_burns_no_seq(
    world: PostgresWorld, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends of one key racing (a worker and serve's reconciling, or a retry after a
    lost reply) leave one event, and the next event gets the next seq."""
    claimed(world)
    lost = LoseReplyOnce(monkeypatch, postgres.events.APPEND_EVENT)
    assert world.append_event("t1", "first", "k", {}).seq == 1  # committed, reply lost
    assert lost.lost == 1
    returned: list[Event] = []
    with raw(url) as conn, conn.transaction():
        # An append in flight, holding the turn's head row: the World's append of the same
        # key begins before it commits, so that key is not in its snapshot.
        params = {"turn_id": "t1", "key": "a", "kind": "k", "data": '{"by":"raw"}', "epoch": None}
        conn.execute(postgres.events.APPEND_EVENT, params)
        thread = threading.Thread(
            target=lambda: returned.append(world.append_event("t1", "a", "k", {"by": "world"}))
        )
        thread.start()
        time.sleep(0.3)
        assert returned == []  # waiting for the head row
    thread.join(timeout=10)
    [event] = returned
    assert (event.seq, event.data) == (2, {"by": "raw"})
    assert world.append_event("t1", "b", "k", {}).seq == 3
    assert [(e.seq, e.key) for e in world.read_events("t1")] == [(1, "first"), (2, "a"), (3, "b")]


def test_claims_under_contention_hand_each_turn_out_once(world: PostgresWorld, url: str) -> None:
    world.create_session("s1")
    for n in range(40):
        world.create_turn("s1", f"t{n:02d}", "hi", {})
    taken: list[str] = []
    lock = threading.Lock()

    def claimer() -> None:
        with PostgresWorld(url) as mine:
            while (lease := mine.claim("w", 30)) is not None:
                with lock:
                    taken.append(lease.turn_id)
                mine.complete_turn(lease, "ok")

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [f"t{n:02d}" for n in range(40)]
    assert {t.status for t in world.list_turns()} == {TurnStatus.DONE}


def test_a_closed_world_fails_at_once(url: str) -> None:
    world = PostgresWorld(url)
    world.close()
    started = time.monotonic()
    with pytest.raises(WorldError, match="is closed"):
        world.list_turns()
    assert time.monotonic() - started < 1
