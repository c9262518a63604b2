"""``serve`` (the HTTP API for apps, docs/api.md) and ``token create|list|revoke`` (its
API tokens, kept hashed in the World)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from durable_harness.cli.common import Commands, policy_flags, settings_of, world_flags
from durable_harness.worlds import open_configured

if TYPE_CHECKING:
    from durable_harness.cli.common import Subparsers

SERVE_EPILOG = """\
Routes (OpenAPI at /openapi.json): POST /v1/sessions, GET /v1/sessions,
GET /v1/sessions/ID, POST /v1/sessions/ID/turns, GET /v1/sessions/ID/turns,
GET /v1/turns, GET /v1/turns/ID, GET /v1/turns/ID/events (Server-Sent Events, resumes
from Last-Event-ID), POST /v1/turns/ID/cancel, POST /v1/turns/ID/signals/NAME,
POST /v1/webhooks/github|gitlab (these two: signal-server's).
Every request carries an API token (`durable-harness token create --tenant NAME`).

Stateless: run as many as you like on one World (postgres, s3sqs) beside the workers.
Give it the workers' settings: it checks each new session as a worker would, with the
model endpoint (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY), the tool files and, for docker
sessions, Docker. A session names tool sets only from --tool-set /
DURABLE_HARNESS_TOOL_SETS here; the workers must register the same names. Limits per
tenant: DURABLE_HARNESS_API_TURNS_PER_MINUTE (60), DURABLE_HARNESS_API_MAX_CONCURRENT_TURNS
(10), DURABLE_HARNESS_API_MAX_BODY_BYTES (1 MiB); the listener's DURABLE_HARNESS_LISTENER_*.
"""


def register(sub: Subparsers) -> Commands:
    serve = sub.add_parser(
        "serve",
        help="the HTTP API for apps: sessions, turns, their event streams (docs/api.md)",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8788, help="port (0: a free one)")
    world_flags(serve)
    policy_flags(serve)

    token = sub.add_parser("token", help="API tokens of `serve`: create, list, revoke")
    actions = token.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create", help="make a token for a tenant and print it (shown once, stored hashed)"
    )
    create.add_argument("--tenant", required=True, help="the tenant it acts for")
    create.add_argument(
        "--operator",
        action="store_true",
        help="an operator token: sees and touches every tenant's sessions and turns",
    )
    create.add_argument("--label", default="", help="a note to tell tokens apart in `list`")
    world_flags(create)
    listing = actions.add_parser("list", help="every token (ids, tenants; never a secret)")
    listing.add_argument("--json", action="store_true")
    world_flags(listing)
    revoke = actions.add_parser("revoke", help="revoke a token: its next request is 401")
    revoke.add_argument("token_id", metavar="ID", help="the id `token list` shows")
    world_flags(revoke)
    return {"serve": cmd_serve, "token": cmd_token}


def cmd_serve(args: argparse.Namespace) -> int:
    from durable_harness.runtime.telemetry import export_metrics
    from durable_harness.server import serve

    settings = settings_of(args)
    with open_configured(settings) as world, export_metrics(world):
        serve(world, settings, args.host, args.port)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from durable_harness.server.auth import create_token

    with open_configured(settings_of(args)) as world:
        if args.token_action == "create":
            token, text = create_token(world, args.tenant, operator=args.operator, label=args.label)
            kind = "operator token" if token.operator else "token"
            print(text)
            print(
                f"{kind} {token.token_id} for tenant {token.tenant}: shown once, keep it "
                "secret (send it as Authorization: Bearer ...)",
                file=sys.stderr,
            )
        elif args.token_action == "list":
            rows = [
                {
                    "token_id": t.token_id,
                    "tenant": t.tenant,
                    "operator": t.operator,
                    "label": t.label,
                    "created_at": t.created_at,
                    "revoked_at": t.revoked_at,
                }
                for t in world.list_tokens()
            ]
            print(json.dumps(rows, indent=2) if args.json else _format(rows))
        else:
            token = world.revoke_token(args.token_id, time.time())
            print(f"token {token.token_id} of tenant {token.tenant} revoked")
    return 0


def _format(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no tokens yet: `durable-harness token create --tenant NAME`"
    lines = [f"{'token':<18}  {'tenant':<20}  {'kind':<8}  {'state':<8}  label"]
    for r in rows:
        kind = "operator" if r["operator"] else "tenant"
        state = "revoked" if r["revoked_at"] is not None else "active"
        lines.append(
            f"{r['token_id']!s:<18}  {r['tenant']!s:<20}  {kind:<8}  {state:<8}  {r['label']}"
        )
    return "\n".join(lines)
