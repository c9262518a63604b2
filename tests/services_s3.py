"""Local S3 and SQS servers for tests and benchmarks (no pytest in here).

* :class:`MotoServer`: ``moto_server`` (S3 and SQS) on 127.0.0.1 and a free port.
* :class:`SeaweedServer`: ``weed mini`` (SeaweedFS, a real S3 server that enforces SigV4)
  in a temp folder, every one of its ports chosen free and bound to 127.0.0.1.
* :class:`NoConditionalWritesProxy`: a loopback HTTP proxy in front of an S3 server that
  drops ``If-None-Match`` and ``If-Match`` from requests: an S3 server that ignores
  conditional writes, as some S3-compatible servers do, built from a real one.

Servers are started lazily (:func:`moto`, :func:`seaweedfs`), once per process, and
stopped by their PID by :func:`stop_all` (the test session's end) or at exit; under
pytest-xdist the run's controller starts one of each for every worker (run_services.py).
:func:`s3sqs_env` makes a fresh bucket and queue (with a dead-letter queue) and yields
the environment and ``open_world`` options that reach them.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import http.server
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orphans import die_with_parent

ACCESS_KEY = "dh-test-access"
SECRET_KEY = "dh-test-secret-key"
REGION = "us-east-1"
_names = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}: {log.read_text()[-2000:]}")


def _bin(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"{name} not found: run scripts/setup (pip install -e '.[dev]')")
    return on_path


class _Server:
    process: subprocess.Popen[bytes] | None = None
    root: Path
    port = 0
    stop_signal = signal.SIGTERM

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, self.stop_signal)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None
        shutil.rmtree(self.root, ignore_errors=True)


class MotoServer(_Server):
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dh-moto-"))
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        self.port = free_port()
        log = self.root / "moto.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(),
            )
        _wait_for_port(self.port, self.process, log, "moto_server")
        return self


class SeaweedServer(_Server):
    stop_signal = signal.SIGINT  # weed stops its components cleanly on SIGINT

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dh-seaweedfs-"))
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SeaweedServer:
        config = self.root / "s3.json"
        identity = {
            "name": "durable-harness-tests",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        self.port = free_port()
        ports = {
            "s3.port": self.port,
            **{
                name: free_port()
                for name in (
                    "s3.port.grpc",
                    "master.port",
                    "master.port.grpc",
                    "volume.port",
                    "volume.port.grpc",
                    "filer.port",
                    "filer.port.grpc",
                    "admin.port",
                    "admin.port.grpc",
                )
            },
            "s3.port.iceberg": 0,
            "s3.port.lance": 0,
        }
        log = self.root / "weed.log"
        args = [
            _bin("weed"),
            "mini",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={config}",
            "-admin.ui=false",
            "-webdav=false",
            # Each test's bucket takes a volume of its own, and by default the number of
            # volumes is free disk / volume size (up to 1 GiB): on a fuller disk the run
            # ran out after ~40 buckets (PUT: InternalError). Small volumes, a fixed cap.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=1000",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        (self.root / "data").mkdir()
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(signal.SIGINT),
            )
        _wait_for_port(self.port, self.process, log, "weed mini")
        return self


class NoConditionalWritesProxy:
    """Forwards HTTP to ``upstream`` without the If-None-Match and If-Match headers."""

    DROPPED = frozenset({"if-none-match", "if-match"})

    def __init__(self, upstream_port: int) -> None:
        dropped, port = self.DROPPED, upstream_port

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                upstream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                finally:
                    upstream.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> NoConditionalWritesProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- one server of each kind per run, else per process -------------------------------
_servers: dict[str, _Server] = {}
_lock = threading.Lock()
#: Set by the run's controller (tests/run_services.py) for its pytest-xdist workers: the
#: port of the run's server of each kind, which a worker uses and never stops.
RUN_ENV = {"moto": "DH_TEST_MOTO_PORT", "seaweedfs": "DH_TEST_SEAWEEDFS_PORT"}


def _attached(server: _Server, kind: str) -> _Server | None:
    port = os.environ.get(RUN_ENV[kind])
    if not port:
        return None
    server.port = int(port)
    server.process = None  # not ours: stop() only removes our empty temp folder
    return server


def moto() -> MotoServer:
    with _lock:
        if "moto" not in _servers:
            fresh = MotoServer()
            _servers["moto"] = _attached(fresh, "moto") or fresh.start()
        server = _servers["moto"]
    assert isinstance(server, MotoServer)
    return server


def seaweedfs() -> SeaweedServer:
    with _lock:
        if "seaweedfs" not in _servers:
            fresh = SeaweedServer()
            _servers["seaweedfs"] = _attached(fresh, "seaweedfs") or fresh.start()
        server = _servers["seaweedfs"]
    assert isinstance(server, SeaweedServer)
    return server


def stop_all() -> None:
    with _lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


atexit.register(stop_all)


def aws_env(s3_url: str, sqs_url: str) -> dict[str, str]:
    """The standard AWS variables that point boto3 at local servers with test credentials."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": s3_url,
        "AWS_ENDPOINT_URL_SQS": sqs_url,
    }


def make_bucket_and_queue(env: dict[str, str], max_receive_count: int = 50) -> tuple[str, str, str]:
    """A fresh bucket, and a queue whose redrive policy names a fresh dead-letter queue."""
    import boto3

    name = f"dh-{os.getpid()}-{next(_names)}-{time.time_ns() % 10**9}"
    kwargs: dict[str, Any] = {
        "region_name": env["AWS_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], **kwargs)
    sqs = boto3.client("sqs", endpoint_url=env["AWS_ENDPOINT_URL_SQS"], **kwargs)
    s3.create_bucket(Bucket=name)
    dlq = sqs.create_queue(QueueName=f"{name}-dead")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
    policy = {"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": str(max_receive_count)}
    queue = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": json.dumps(policy)})
    s3.close()
    sqs.close()
    return name, str(queue["QueueUrl"]), str(dlq)


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def s3sqs_env(s3_url: str, sqs_url: str, max_receive_count: int = 50) -> Iterator[dict[str, Any]]:
    """Set the AWS variables in ``os.environ`` (children inherit them) for a fresh bucket
    and queue; yield the ``open_world("s3sqs", ...)`` options."""
    env = aws_env(s3_url, sqs_url)
    bucket, queue_url, _ = make_bucket_and_queue(env, max_receive_count)
    with patched_environ(env):
        yield {"bucket": bucket, "queue_url": queue_url}
