"""The journaling proxy's added latency, beside a direct connection to the same model.

One process, one machine, loopback only. The model is the bundled fake model, streaming a
reply of ``--events`` SSE events (``--chunk-ms`` apart, 0 by default, so the figures are
the proxy's own cost, not the model's). Three ways to ask it, interleaved request by
request so drift hits all alike:

* **direct**: the client talks to the fake model;
* **proxy, live**: through :class:`JournalingProxy` with a local World (SQLite WAL,
  ``synchronous=FULL``): canonicalize and hash the request, commit the intent, forward,
  tee every event to the client as it arrives, commit the outcome, then send
  ``message_stop``. Each request is new (a distinct prompt), so each is forwarded;
* **proxy, replay**: the same requests again: answered from the journal, upstream is not
  called.

For each: time to the first byte of the response body (TTFB) and to its last byte
(total), median and p95 over ``--requests`` requests after ``--warmup`` untimed ones.
The request body imitates Claude Code's size (``--body-kb`` of system prompt, 90 KiB by
default). Run: ``python bench/proxy_latency.py [--requests 200]``; the last line of the
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream
from durable_harness.harness.journal import Journal
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.worlds import open_world

TOKEN = "bench-token"


def script(events: int, chunk_ms: int) -> str:
    words = " ".join(f"w{i}" for i in range(max(events - 6, 1) * 4))
    return f'[[rule]]\nreply.text = "{words}"\nreply.chunk_delay_ms = {chunk_ms}\n'


def body(n: int, body_kb: int) -> bytes:
    system = "You are Claude Code. " * (body_kb * 1024 // 21)
    return json.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": True,
            "system": [{"type": "text", "text": system}],
            "messages": [{"role": "user", "content": f"request {n}: add a pricing page"}],
        }
    ).encode()


def ask(url: str, data: bytes, conn: http.client.HTTPConnection | None) -> tuple[float, float]:
    """(ttfb, total) in seconds for one streamed request (keep-alive connection)."""
    assert conn is not None
    started = time.perf_counter()
    conn.request("POST", "/v1/messages?beta=true", data, {"x-api-key": TOKEN})
    response = conn.getresponse()
    first = response.read1(1)
    ttfb = time.perf_counter() - started
    rest = response.read()
    total = time.perf_counter() - started
    assert response.status == 200 and first and rest.rstrip().endswith(b"}"), response.status
    return ttfb, total


def connect(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(p95 * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--chunk-ms", type=int, default=0)
    parser.add_argument("--body-kb", type=int, default=90)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        world = open_world("local", data_dir=Path(tmp) / "world")
        world.create_session("ses_bench", {})
        world.create_turn("ses_bench", "turn_bench", "bench", {"agent": "claude-code"})
        lease = world.claim_turn("turn_bench", "bench", 3600)
        assert lease is not None
        journal = Journal(world, lease)
        fake = FakeModelServer(parse_script(script(args.events, args.chunk_ms))).start()
        proxy = JournalingProxy(
            journal,
            ClaudeCodeCanonicalizer(),
            Upstream(fake.url, "provider-key"),
            TOKEN,
            models=("claude-sonnet-4-5",),
        ).start()
        results: dict[str, dict[str, list[float]]] = {
            way: {"ttfb": [], "total": []} for way in ("direct", "proxy_live", "proxy_replay")
        }
        conns = {"direct": connect(fake.url), "proxy": connect(proxy.url)}
        try:
            for n in range(args.warmup + args.requests):
                data = body(n, args.body_kb)
                timings: dict[str, tuple[float, float]] = {
                    "direct": ask(fake.url, data, conns["direct"]),
                    "proxy_live": ask(proxy.url, data, conns["proxy"]),
                    "proxy_replay": ask(proxy.url, data, conns["proxy"]),
                }
                if n >= args.warmup:
                    for way, (ttfb, total) in timings.items():
                        results[way]["ttfb"].append(ttfb)
                        results[way]["total"].append(total)
            forwarded = proxy.stats.upstream_calls
            replayed = proxy.stats.replayed
        finally:
            for conn in conns.values():
                conn.close()
            proxy.close()
            fake.stop()
            world.close()

    report: dict[str, Any] = {
        "requests": args.requests,
        "events_per_reply": args.events,
        "chunk_ms": args.chunk_ms,
        "body_kb": args.body_kb,
        "upstream_calls": forwarded,
        "replayed": replayed,
    }
    print(f"{args.requests} streamed requests, {args.body_kb} KiB bodies, {args.events} events")
    print(f"{'':14} {'TTFB median':>12} {'TTFB p95':>10} {'total median':>13} {'total p95':>10}")
    for way, samples in results.items():
        ttfb, total = summary(samples["ttfb"]), summary(samples["total"])
        report[way] = {"ttfb": ttfb, "total": total}
        print(
            f"{way:14} {ttfb['median_ms']:>10.2f}ms {ttfb['p95_ms']:>8.2f}ms "
            f"{total['median_ms']:>11.2f}ms {total['p95_ms']:>8.2f}ms"
        )
    for way in ("proxy_live", "proxy_replay"):
        added = {
            k: round(report[way][k]["median_ms"] - report["direct"][k]["median_ms"], 3)
            for k in ("ttfb", "total")
        }
        report[way]["added_median_ms"] = added
        print(f"added by {way}: TTFB {added['ttfb']:+.2f}ms, total {added['total']:+.2f}ms")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
