"""The PostgreSQL World's statements, one constant each, and the decoding of their rows.

Conventions that every statement here keeps (see the package docstring for why):

* a fenced write names its epoch and checks it in the same statement against the turn's
  ``jobs`` row, locked ``FOR SHARE`` (or updated/deleted), never in a separate read;
* a statement that writes several tables locks the ``jobs`` row first;
* times the World assigns to leases and visibility are ``durable_harness.epoch_now()``,
  the server's clock; step timestamps are the worker's, like ``Step.started_at``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from durable_harness.core.errors import CorruptJournal
from durable_harness.core.types import Lease, Session, Step, StepStatus, Turn, TurnStatus

Row = dict[str, Any]
_E = TypeVar("_E", TurnStatus, StepStatus)

# -- blobs ----------------------------------------------------------------------------------
# A blob already stored is touched, not skipped: gc's DELETE ... WHERE touched_at < cutoff
# and this upsert take the row's lock, so a reuse either lands first (the DELETE, which
# re-checks its WHERE on the row it waited for, keeps the blob) or inserts it anew.
PUT_BLOB = """
INSERT INTO durable_harness.blobs (digest, data, touched_at)
VALUES (%s, %b, durable_harness.epoch_now())
ON CONFLICT (digest) DO UPDATE SET touched_at = EXCLUDED.touched_at"""

TOUCH_BLOB = """
UPDATE durable_harness.blobs SET touched_at = durable_harness.epoch_now()
WHERE digest = %s RETURNING 1 AS found"""

GET_BLOB = "SELECT data FROM durable_harness.blobs WHERE digest = %s"

# -- sessions -------------------------------------------------------------------------------
CREATE_SESSION = """
WITH created AS (
    INSERT INTO durable_harness.sessions (session_id, created_at, meta)
    VALUES (%(session_id)s, durable_harness.epoch_now(), %(meta)s)
    ON CONFLICT (session_id) DO NOTHING
    RETURNING session_id, created_at, meta
)
SELECT session_id, created_at, meta FROM created
UNION ALL
SELECT session_id, created_at, meta FROM durable_harness.sessions
WHERE session_id = %(session_id)s AND NOT EXISTS (SELECT FROM created)"""

GET_SESSION = """
SELECT session_id, created_at, meta FROM durable_harness.sessions WHERE session_id = %s"""

LIST_SESSIONS = """
SELECT session_id, created_at, meta FROM durable_harness.sessions
ORDER BY created_at DESC, id DESC LIMIT %s"""

# NO KEY UPDATE: serializes turn creation within the session, yet does not block the
# key-share locks that inserting rows referencing the session takes.
LOCK_SESSION = """
SELECT session_id FROM durable_harness.sessions WHERE session_id = %s FOR NO KEY UPDATE"""

PUT_RECORD = """
INSERT INTO durable_harness.session_records (session_id, name, digest)
SELECT %s, %s, %s FROM durable_harness.sessions WHERE session_id = %s
ON CONFLICT (session_id, name) DO UPDATE SET digest = excluded.digest
RETURNING 1 AS ok"""

GET_RECORD = """
SELECT digest FROM durable_harness.session_records WHERE session_id = %s AND name = %s"""

# -- turns ----------------------------------------------------------------------------------
GET_TURN = "SELECT * FROM durable_harness.turn_view WHERE turn_id = %s"

LIST_TURNS = "SELECT * FROM durable_harness.turn_view ORDER BY created_at DESC, id DESC LIMIT %s"

ANY_JOB = "SELECT 1 AS one FROM durable_harness.jobs LIMIT 1"

# Once per metrics export interval (runtime/telemetry): one scan, no rows sent back.
COUNT_TURNS = """
SELECT status, count(*) AS n, count(*) FILTER (WHERE error LIKE %s) AS dead
FROM durable_harness.turn_view GROUP BY status"""

LIST_SESSION_TURNS = """
SELECT * FROM durable_harness.turn_view WHERE session_id = %s ORDER BY idx LIMIT %s"""

# Run after LOCK_SESSION in the same transaction: this statement's snapshot is taken after
# the lock, so MAX(idx) sees every turn committed before it.
INSERT_TURN = """
WITH created AS (
    INSERT INTO durable_harness.turns (turn_id, session_id, idx, prompt, config, created_at)
    SELECT %(turn_id)s, %(session_id)s, COALESCE(MAX(idx) + 1, 0), %(prompt)s, %(config)s,
           durable_harness.epoch_now()
    FROM durable_harness.turns WHERE session_id = %(session_id)s
    RETURNING turn_id, id, created_at
)
INSERT INTO durable_harness.jobs (turn_id, turn_no, status, visible_at)
SELECT turn_id, id, 'queued', created_at FROM created"""

NOTIFY = "SELECT pg_notify('durable_harness_work', '')"

# Seconds until the next job becomes deliverable (NULL: the queue is empty).
NEXT_VISIBLE = "SELECT MIN(visible_at) - durable_harness.epoch_now() FROM durable_harness.jobs"
# Whether a turn runs under another process's claim: its holder may die at any moment.
OTHERS_RUNNING = """
SELECT EXISTS (SELECT FROM durable_harness.jobs
               WHERE status = 'running' AND holder_key IS DISTINCT FROM %(mine)s)"""

# -- queue ----------------------------------------------------------------------------------
ENQUEUE_QUEUED = """
WITH moved AS (
    UPDATE durable_harness.jobs SET visible_at = durable_harness.epoch_now() + %(delay)s
    WHERE turn_id = %(turn_id)s AND status IN ('queued', 'waiting')
    RETURNING turn_id
)
SELECT turn_id, pg_notify('durable_harness_work', '') FROM moved"""

ENQUEUE_FAILED = """
WITH revived AS (
    UPDATE durable_harness.turns SET status = 'open', finished_at = NULL
    WHERE turn_id = %(turn_id)s AND status = 'failed'
    RETURNING turn_id, id, epoch
), queued AS (
    INSERT INTO durable_harness.jobs (turn_id, turn_no, status, visible_at, attempts, epoch)
    SELECT turn_id, id, 'queued', durable_harness.epoch_now() + %(delay)s, 0, epoch
    FROM revived
    RETURNING turn_id
)
SELECT turn_id, pg_notify('durable_harness_work', '') FROM queued"""

# A claim's lease: one more attempt, the next epoch, hidden for the lease (both claims).
_TAKE_LEASE = """UPDATE durable_harness.jobs j
SET status = 'running', attempts = j.attempts + 1, epoch = j.epoch + 1,
    lease_owner = %(owner)s, holder_key = %(holder)s,
    lease_expires_at = durable_harness.epoch_now() + %(lease)s,
    visible_at = durable_harness.epoch_now() + %(lease)s,
    waiting_for = NULL"""

# The oldest visible job (queued, woken, or with an expired lease), leased in the same
# statement. A job whose deliveries are used up comes back with a NULL epoch: the caller
# dead-letters it and claims again.
CLAIM = f"""
WITH next AS (
    SELECT turn_id FROM durable_harness.jobs
    WHERE visible_at <= durable_harness.epoch_now()
    ORDER BY turn_no
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), taken AS (
    {_TAKE_LEASE}
    FROM next
    WHERE j.turn_id = next.turn_id AND j.attempts - j.attempt_floor < %(max)s
    RETURNING j.turn_id, j.epoch, j.attempts, j.lease_expires_at
)
SELECT next.turn_id, t.session_id, taken.epoch, taken.attempts, taken.lease_expires_at
FROM next
JOIN durable_harness.turns t ON t.turn_id = next.turn_id
LEFT JOIN taken ON taken.turn_id = next.turn_id"""

CLAIM_TURN = f"""
{_TAKE_LEASE}
FROM durable_harness.turns t
WHERE j.turn_id = %(turn_id)s AND t.turn_id = j.turn_id
  AND (%(force)s OR j.visible_at <= durable_harness.epoch_now())
  AND j.attempts - j.attempt_floor < %(max)s
RETURNING j.turn_id, t.session_id, j.epoch, j.attempts, j.lease_expires_at"""

# Deleting the job is idempotent: a second dead-letter of the same turn finds no job.
DEAD_LETTER = """
WITH dead AS (
    DELETE FROM durable_harness.jobs
    WHERE turn_id = %(turn_id)s AND attempts - attempt_floor >= %(max)s
      AND (%(force)s OR visible_at <= durable_harness.epoch_now())
    RETURNING turn_id, attempts, epoch
)
UPDATE durable_harness.turns t
SET status = 'failed', attempts = dead.attempts, epoch = dead.epoch + 1,
    error = 'dead-lettered after ' || dead.attempts || ' deliveries; last error: '
            || COALESCE(t.error, 'lease expired (worker died?)'),
    finished_at = durable_harness.epoch_now()
FROM dead WHERE t.turn_id = dead.turn_id
RETURNING t.turn_id"""

# A lease whose holder was found dead (PULL_IN_DEAD cleared holder_key) is not renewed:
# it runs out within the grace period and is claimed again.
RENEW = """
UPDATE durable_harness.jobs
SET lease_expires_at = durable_harness.epoch_now() + %(lease)s,
    visible_at = durable_harness.epoch_now() + %(lease)s
WHERE turn_id = %(turn_id)s AND epoch = %(epoch)s AND status = 'running'
  AND holder_key IS NOT NULL
RETURNING lease_expires_at"""

# Running jobs whose holder's advisory lock is free (its session ended: holder.py) get a
# lease that ends %(grace)s seconds from now, and no holder. The lock is tried only on
# running jobs with a live lease (the CASE keeps the planner from trying it on others) and
# is held only until this statement's transaction ends.
PULL_IN_DEAD = """
UPDATE durable_harness.jobs
SET holder_key = NULL,
    lease_expires_at = LEAST(lease_expires_at, durable_harness.epoch_now() + %(grace)s),
    visible_at = LEAST(visible_at, durable_harness.epoch_now() + %(grace)s)
WHERE status = 'running' AND holder_key IS NOT NULL
  AND CASE WHEN visible_at > durable_harness.epoch_now() + %(grace)s
           THEN pg_try_advisory_xact_lock(holder_key) ELSE false END
RETURNING turn_id"""

RELEASE = """
WITH released AS (
    UPDATE durable_harness.jobs
    SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
        visible_at = durable_harness.epoch_now() + %(delay)s
    WHERE turn_id = %(turn_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING turn_id
), noted AS (
    UPDATE durable_harness.turns t SET error = %(error)s::text
    FROM released WHERE t.turn_id = released.turn_id AND %(error)s::text IS NOT NULL
)
SELECT turn_id, pg_notify('durable_harness_work', '') FROM released"""

# Ends the turn for good: its job goes (no more deliveries), its final counts stay.
FINISH_TURN = """
WITH ended AS (
    DELETE FROM durable_harness.jobs
    WHERE turn_id = %(turn_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING turn_id, attempts, epoch
)
UPDATE durable_harness.turns t
SET status = %(status)s, attempts = ended.attempts, epoch = ended.epoch,
    result = COALESCE(%(result)s::text, t.result), error = COALESCE(%(error)s::text, t.error),
    finished_at = durable_harness.epoch_now()
FROM ended WHERE t.turn_id = ended.turn_id
RETURNING t.turn_id"""

# -- durable waits ------------------------------------------------------------------------
# suspend and send_signal each lock the job row first and look at the other's table in a
# later statement (a new snapshot): whichever commits second sees the first, so a signal
# racing a suspend always wakes the turn.
NOW = "SELECT durable_harness.epoch_now() AS now"

LOCK_RUNNING_JOB = """
SELECT epoch FROM durable_harness.jobs
WHERE turn_id = %s AND epoch = %s AND status = 'running'
FOR UPDATE"""

SUSPEND = """
WITH parked AS (
    UPDATE durable_harness.jobs
    SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL,
        waiting_for = %(waiting_for)s, attempt_floor = attempts,
        visible_at = CASE
            WHEN (SELECT count(*) FROM durable_harness.signal_log
                  WHERE turn_id = %(turn_id)s AND name = %(signal)s::text) > %(seen)s
            THEN durable_harness.epoch_now()
            ELSE %(wake_at)s END
    WHERE turn_id = %(turn_id)s
    RETURNING turn_id
)
SELECT turn_id, pg_notify('durable_harness_work', '') FROM parked"""

LOCK_JOB = "SELECT status FROM durable_harness.jobs WHERE turn_id = %s FOR UPDATE"

# The job row (or, for a turn that ended, the turn row) is locked first: one insert at a
# time per turn, so idx is the count so far.
LOCK_TURN = "SELECT turn_id FROM durable_harness.turns WHERE turn_id = %s FOR UPDATE"

INSERT_SIGNAL = """
INSERT INTO durable_harness.signal_log (turn_id, name, idx, delivery_id, payload, received_at)
SELECT %(turn_id)s, %(name)s, count(*), %(delivery_id)s, %(payload)s, durable_harness.epoch_now()
FROM durable_harness.signal_log WHERE turn_id = %(turn_id)s AND name = %(name)s
ON CONFLICT (turn_id, name, delivery_id) DO NOTHING
RETURNING idx"""

GET_DELIVERY = """
SELECT payload FROM durable_harness.signal_log
WHERE turn_id = %s AND name = %s AND delivery_id = %s"""

LIST_SIGNALS = """
SELECT idx, payload, delivery_id, claimed_by FROM durable_harness.signal_log
WHERE turn_id = %s AND name = %s ORDER BY idx"""

CLAIM_SIGNAL = """
WITH taken AS (
    UPDATE durable_harness.signal_log SET claimed_by = %(seq)s
    WHERE turn_id = %(turn_id)s AND name = %(name)s AND idx = %(idx)s AND claimed_by IS NULL
    RETURNING claimed_by
)
SELECT claimed_by FROM taken
UNION ALL
SELECT claimed_by FROM durable_harness.signal_log
WHERE turn_id = %(turn_id)s AND name = %(name)s AND idx = %(idx)s AND claimed_by IS NOT NULL"""

INSERT_WATCH = """
INSERT INTO durable_harness.watches (scope, turn_id, name, ref) VALUES (%s, %s, %s, %s)
ON CONFLICT (scope, turn_id, name) DO UPDATE SET ref = excluded.ref"""

LIST_WATCHERS = """
SELECT turn_id, name FROM durable_harness.watches WHERE scope = %s AND ref = %s
ORDER BY turn_id, name"""

WAKE = """
WITH woken AS (
    UPDATE durable_harness.jobs SET visible_at = durable_harness.epoch_now()
    WHERE turn_id = %s AND status = 'waiting'
    RETURNING turn_id
)
SELECT turn_id, pg_notify('durable_harness_work', '') FROM woken"""

FENCE = """
SELECT epoch FROM durable_harness.jobs WHERE turn_id = %s AND epoch = %s AND status = 'running'"""

# -- journal --------------------------------------------------------------------------------
# One row with a NULL seq when the turn has no steps; no row when there is no such turn.
LOAD_STEPS = """
SELECT t.turn_id AS of_turn, s.turn_id, s.seq, s.key, s.kind, s.name, s.input_hash, s.input,
       s.status, s.output, s.output_blob, s.attempts, s.epoch, s.started_at, s.finished_at,
       s.meta
FROM durable_harness.turns t LEFT JOIN durable_harness.steps s ON s.turn_id = t.turn_id
WHERE t.turn_id = %s
ORDER BY s.seq"""

GET_STEP = "SELECT * FROM durable_harness.steps WHERE turn_id = %s AND seq = %s"

CONFLICTING_STEP = """
SELECT * FROM durable_harness.steps WHERE turn_id = %s AND (seq = %s OR key = %s)
ORDER BY seq LIMIT 1"""

# The intent, fenced: inserted only while the job holds this epoch, and the job row stays
# share-locked until COMMIT, so no claim can slip between the check and the insert.
INSERT_INTENT = """
INSERT INTO durable_harness.steps
    (turn_id, seq, key, kind, name, input_hash, input, status, attempts, epoch, started_at,
     meta)
SELECT %(turn_id)s, %(seq)s, %(key)s, %(kind)s, %(name)s, %(input_hash)s, %(input)s, 'intent',
       %(attempts)s, %(epoch)s, %(started_at)s, %(meta)s
FROM durable_harness.jobs
WHERE turn_id = %(turn_id)s AND epoch = %(epoch)s AND status = 'running'
FOR SHARE
ON CONFLICT DO NOTHING
RETURNING seq"""

_FENCED = """
  AND EXISTS (
    SELECT FROM durable_harness.jobs j
    WHERE j.turn_id = %(turn_id)s AND j.epoch = %(epoch)s AND j.status = 'running'
    FOR SHARE)"""

RESTART_INTENT = (
    """
UPDATE durable_harness.steps s
SET attempts = s.attempts + 1, epoch = %(epoch)s
WHERE s.turn_id = %(turn_id)s AND s.seq = %(seq)s AND s.status = 'intent'"""
    + _FENCED
    + """
RETURNING s.attempts"""
)

# meta is merged (jsonb ||), not replaced: what the intent recorded stays visible.
FINISH_STEP = (
    """
UPDATE durable_harness.steps s
SET status = %(status)s, output = %(output)s, output_blob = %(output_blob)s,
    epoch = %(epoch)s, finished_at = %(now)s, meta = s.meta || %(meta)s
WHERE s.turn_id = %(turn_id)s AND s.seq = %(seq)s AND s.status = 'intent'"""
    + _FENCED
    + """
RETURNING s.seq"""
)


# -- rows ---------------------------------------------------------------------------------
def lease_of(row: Row, owner: str) -> Lease:
    return Lease(
        turn_id=row["turn_id"],
        session_id=row["session_id"],
        owner=owner,
        epoch=int(row["epoch"]),
        attempt=int(row["attempts"]),
        expires_at=float(row["lease_expires_at"]),
    )


def json_object(value: Any, where: str, column: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CorruptJournal(f"{where}: column {column} is not a JSON object")
    return value


def _enum(kind: type[_E], value: Any, where: str) -> _E:
    try:
        return kind(value)
    except ValueError as exc:
        raise CorruptJournal(f"{where}: unknown status {value!r}") from exc


def session_of(row: Row) -> Session:
    meta = json_object(row["meta"], f"session {row['session_id']}", "meta")
    return Session(session_id=row["session_id"], created_at=row["created_at"], meta=meta)


def turn_of(row: Row) -> Turn:
    where = f"turn {row['turn_id']}"
    return Turn(
        **_columns(row, Turn),
        index=row["idx"],
        status=_enum(TurnStatus, row["status"], where),  # 'open' without a job: corrupt
        config=json_object(row["config"], where, "config"),
    )


def step_of(row: Row) -> Step:
    where = f"turn {row['turn_id']} step {row['seq']}"
    return Step(
        **_columns(row, Step),
        status=_enum(StepStatus, row["status"], where),
        meta=json_object(row["meta"], where, "meta"),
    )


def _columns(row: Row, kind: type[Any]) -> dict[str, Any]:
    """The row's values for the fields of dataclass ``kind`` that the row names alike,
    less those the decoders above convert (status, config, meta)."""
    converted = ("status", "config", "meta")
    return {
        f.name: row[f.name]
        for f in dataclasses.fields(kind)
        if f.name in row and f.name not in converted
    }
