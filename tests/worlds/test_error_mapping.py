"""Every driver error a World meets is mapped at the backend's boundary (STYLE: errors).

For each backend, on its real server, each test provokes one failure of its driver
(sqlite3 and the filesystem, psycopg, botocore): the server gone or never there, rejected
or missing credentials, a missing database, bucket or queue, a corrupt SQLite file, a
folder the user may not write. The error must be one of the project's
(:class:`DurableHarnessError`, never the driver's own), chained to the driver's exception,
one line long, and say what to do next.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import psycopg
import pytest
import services_s3
from postgres_server import PASSWORD, PostgresServer, free_port

from durable_harness.core.errors import ConfigError, DurableHarnessError, WorldError
from durable_harness.core.world import World
from durable_harness.worlds import open_world, postgres
from durable_harness.worlds.local import DB_NAME

DATA_DIR_ADVICE = r"DURABLE_HARNESS_DATA_DIR"
POSTGRES_ADVICE = r"DURABLE_HARNESS_POSTGRES_URL"


def raised(call: Callable[[], object]) -> DurableHarnessError:
    """The project error ``call`` raises; fails on a raw driver exception or on none."""
    try:
        call()
    except DurableHarnessError as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"unmapped driver error: {type(exc).__module__}.{type(exc).__name__}: {exc}")
    pytest.fail("no error was raised")


def assert_mapped(
    exc: DurableHarnessError,
    kind: type[DurableHarnessError],
    cause: type[BaseException] | None,
    *advice: str,
) -> None:
    """``exc`` is a ``kind`` on one line matching each of ``advice``, chained to a
    ``cause`` (``None``: a backend that raises it ``from None``)."""
    message = str(exc)
    assert isinstance(exc, kind), (type(exc), message)
    if cause is not None:
        assert isinstance(exc.__cause__, cause), (type(exc.__cause__), message)
    assert "\n" not in message, message
    for pattern in advice:
        assert re.search(pattern, message), (pattern, message)


# -- local: sqlite3 and the filesystem ----------------------------------------------------
def open_local(path: Path) -> World:
    return open_world("local", data_dir=path)


def test_local_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    exc = raised(lambda: open_local(tmp_path))
    assert_mapped(exc, WorldError, sqlite3.DatabaseError, "not a database", DATA_DIR_ADVICE)


def test_local_a_folder_where_the_database_should_be(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).mkdir()
    exc = raised(lambda: open_local(tmp_path))
    assert_mapped(exc, WorldError, sqlite3.Error, str(tmp_path), DATA_DIR_ADVICE)


def test_local_a_file_where_the_folder_should_be(tmp_path: Path) -> None:
    (tmp_path / "world").write_text("a file")
    exc = raised(lambda: open_local(tmp_path / "world"))
    assert_mapped(exc, WorldError, OSError, "cannot create the World folder", DATA_DIR_ADVICE)


def test_local_an_unreadable_blob(tmp_path: Path) -> None:
    with open_local(tmp_path) as world:
        digest = world.put_blob(b"payload")
        blob = next(p for p in (tmp_path / "blobs").rglob("*") if p.name.endswith(digest[4:]))
        blob.unlink()
        blob.mkdir()  # reading it now fails with an OSError that is not "missing"
        exc = raised(lambda: world.get_blob(digest))
    assert_mapped(exc, WorldError, OSError, digest[:12])


def test_local_a_folder_the_user_may_not_write(tmp_path: Path) -> None:
    """A World the user may only read. Root ignores file permissions, so as root the probe
    runs without the capabilities that let it (``setpriv``)."""
    folder = tmp_path / "world"
    open_local(folder).close()
    probe = (
        "import json, sys\n"
        "from durable_harness.core.errors import DurableHarnessError\n"
        "from durable_harness.worlds import open_world\n"
        "try:\n"
        "    open_world('local', data_dir=sys.argv[1]).put_blob(b'x')\n"
        "    print(json.dumps(None))\n"
        "except DurableHarnessError as exc:\n"
        "    print(json.dumps([type(exc).__name__, str(exc), type(exc.__cause__).__name__]))\n"
    )
    command = [sys.executable, "-c", probe, str(folder)]
    if os.geteuid() == 0:
        drop = "-dac_override,-dac_read_search,-fowner"
        command = ["setpriv", "--bounding-set", drop, "--inh-caps=-all", "--", *command]
    paths = [folder, *folder.rglob("*")]
    modes = {path: path.stat().st_mode for path in paths}
    try:
        for path in paths:
            path.chmod(modes[path] & ~0o222)
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    finally:
        for path in paths:
            path.chmod(modes[path])
    assert out.returncode == 0, out.stderr  # an unmapped error would be a traceback here
    result = json.loads(out.stdout)
    assert result is not None, "the World wrote in a folder the user may not write"
    name, message, cause = result
    assert name == "WorldError" and cause in ("OperationalError", "PermissionError"), result
    assert "\n" not in message and re.search("readonly|read-only|ermission", message), message
    assert re.search("may (read and )?write", message), message


# -- postgres: psycopg ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("make_url", "kind", "advice"),
    [
        pytest.param(
            lambda pg: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/x",
            WorldError,
            ("cannot reach PostgreSQL", POSTGRES_ADVICE),
            id="connection-refused",
        ),
        pytest.param(
            lambda pg: pg.url(password="wrong-password"),
            ConfigError,
            ("password authentication failed", POSTGRES_ADVICE),
            id="wrong-password",
        ),
        pytest.param(
            lambda pg: pg.url("no_such_db"),
            ConfigError,
            ("does not exist", "createdb no_such_db"),
            id="missing-database",
        ),
    ],
)
def test_postgres_cannot_connect(
    postgres: PostgresServer,
    make_url: Callable[[PostgresServer], str],
    kind: type[DurableHarnessError],
    advice: tuple[str, ...],
) -> None:
    exc = raised(lambda: open_world(make_url(postgres)))
    # postgres.schema.connect raises these "from None".
    assert_mapped(exc, kind, None, *advice)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, which it may stop."""
    with PostgresServer() as server:
        yield server


def test_postgres_server_gone_while_open(
    own_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "RECONNECT_SECONDS", 1.0)
    world = open_world(own_postgres.url())
    try:
        world.create_session("s1")
        own_postgres.stop()
        exc = raised(lambda: world.get_session("s1"))
    finally:
        world.close()
    assert_mapped(exc, WorldError, psycopg.Error, "did not come back", "server is running")


def test_postgres_permission_denied(postgres: PostgresServer) -> None:
    with postgres.database() as url:
        open_world(url).close()  # the owner creates the schema
        dbname = url.rsplit("/", 1)[1]
        postgres.admin("DROP ROLE IF EXISTS dh_mapping_reader")
        postgres.admin(f"CREATE ROLE dh_mapping_reader LOGIN PASSWORD '{PASSWORD}'")
        try:
            postgres.admin(
                "GRANT USAGE ON SCHEMA durable_harness TO dh_mapping_reader", dbname=dbname
            )
            postgres.admin(
                "GRANT SELECT ON ALL TABLES IN SCHEMA durable_harness TO dh_mapping_reader",
                dbname=dbname,
            )
            with open_world(url.replace("postgres:", "dh_mapping_reader:", 1)) as world:
                exc = raised(lambda: world.create_session("s1"))
        finally:
            postgres.admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            postgres.admin("DROP ROLE IF EXISTS dh_mapping_reader")
    assert_mapped(exc, WorldError, psycopg.Error, "permission denied", "GRANT")


def test_postgres_closed_world(postgres: PostgresServer) -> None:
    with postgres.database() as url:
        world = open_world(url)
        world.close()
        exc = raised(lambda: world.get_turn("t1"))
    assert_mapped(exc, WorldError, Exception, "closed")


# -- s3sqs: botocore ------------------------------------------------------------------
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, Any]]:
    """``aws(s3_url, sqs_url)``: point boto3 at the servers; a fresh bucket and queue's
    options (this test's environment only)."""

    def point(s3_url: str, sqs_url: str) -> dict[str, Any]:
        env = services_s3.aws_env(s3_url, sqs_url)
        bucket, queue_url, _ = services_s3.make_bucket_and_queue(env)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return {"bucket": bucket, "queue_url": queue_url}

    return point


def moto_url() -> str:
    return services_s3.moto().url


def test_s3sqs_s3_connection_refused(
    aws: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    options = aws(moto_url(), moto_url())
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    exc = raised(lambda: open_world("s3sqs", **options))
    assert_mapped(
        exc, WorldError, botocore.exceptions.BotoCoreError, "cannot reach S3", "AWS_ENDPOINT_URL"
    )


def test_s3sqs_sqs_connection_refused(
    aws: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    options = aws(moto_url(), moto_url())
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{free_port()}")
    exc = raised(lambda: open_world("s3sqs", **options))
    assert_mapped(
        exc, WorldError, botocore.exceptions.BotoCoreError, "cannot reach SQS", "AWS_ENDPOINT_URL"
    )


def test_s3sqs_wrong_credentials(
    aws: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto accepts any credentials; SeaweedFS checks SigV4 signatures as AWS does.
    options = aws(services_s3.seaweedfs().url, moto_url())
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    exc = raised(lambda: open_world("s3sqs", **options))
    assert_mapped(
        exc, ConfigError, botocore.exceptions.ClientError, "rejected", "AWS_SECRET_ACCESS_KEY"
    )


def test_s3sqs_no_credentials(
    aws: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = aws(moto_url(), moto_url())
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    exc = raised(lambda: open_world("s3sqs", **options))
    assert_mapped(exc, ConfigError, botocore.exceptions.NoCredentialsError, "AWS_ACCESS_KEY_ID")


@pytest.mark.parametrize("missing", ["bucket", "queue_url"])
def test_s3sqs_missing_bucket_or_queue(aws: Callable[..., dict[str, Any]], missing: str) -> None:
    options = aws(moto_url(), moto_url())
    options[missing] += "-gone"
    env = "DURABLE_HARNESS_S3_BUCKET" if missing == "bucket" else "DURABLE_HARNESS_SQS_QUEUE_URL"
    exc = raised(lambda: open_world("s3sqs", **options))
    assert_mapped(exc, ConfigError, botocore.exceptions.ClientError, "does not exist", env)


def _client(service: str, url: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=services_s3.REGION,
        aws_access_key_id=services_s3.ACCESS_KEY,
        aws_secret_access_key=services_s3.SECRET_KEY,
    )


def test_s3sqs_bucket_deleted_while_open(aws: Callable[..., dict[str, Any]]) -> None:
    options = aws(moto_url(), moto_url())
    with open_world("s3sqs", **options) as world:
        s3 = _client("s3", moto_url())
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=options["bucket"]):
            for item in page.get("Contents", []):
                s3.delete_object(Bucket=options["bucket"], Key=item["Key"])
        s3.delete_bucket(Bucket=options["bucket"])
        s3.close()
        exc = raised(lambda: world.create_session("s1"))
    assert_mapped(
        exc,
        WorldError,
        botocore.exceptions.ClientError,
        "does not exist",
        "DURABLE_HARNESS_S3_BUCKET",
    )


def test_s3sqs_queue_deleted_while_open(aws: Callable[..., dict[str, Any]]) -> None:
    options = aws(moto_url(), moto_url())
    with open_world("s3sqs", **options) as world:
        world.create_session("s1")
        sqs = _client("sqs", moto_url())
        sqs.delete_queue(QueueUrl=options["queue_url"])
        sqs.close()
        exc = raised(lambda: world.create_turn("s1", "t1", "hi", {}))
    assert_mapped(
        exc,
        WorldError,
        botocore.exceptions.ClientError,
        "does not exist",
        "DURABLE_HARNESS_SQS_QUEUE_URL",
    )


def test_s3sqs_server_gone_while_open(aws: Callable[..., dict[str, Any]]) -> None:
    server = services_s3.MotoServer().start()
    try:
        options = aws(server.url, server.url)
        world = open_world("s3sqs", **options)
        world.create_session("s1")
        server.stop()
        exc = raised(lambda: world.get_session("s1"))
        world.close()
    finally:
        server.stop()
    assert_mapped(
        exc, WorldError, botocore.exceptions.BotoCoreError, "cannot reach S3", "AWS_ENDPOINT_URL"
    )
