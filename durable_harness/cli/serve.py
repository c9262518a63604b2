"""``serve`` (the HTTP API for apps, docs/api.md), ``ui`` (the same app with the web
viewer for a local World, docs/viewer.md) and ``token create|list|revoke`` (their API
tokens, kept hashed in the World)."""

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
GET /v1/turns (?status=, ?q=), GET /v1/turns/ID, GET /v1/turns/ID/steps,
GET /v1/turns/ID/steps/SEQ, GET /v1/turns/ID/events (Server-Sent Events, resumes
from Last-Event-ID), POST /v1/turns/ID/cancel, POST /v1/turns/ID/steps/SEQ/approval
(operator tokens and those in DURABLE_HARNESS_API_APPROVER_TOKENS),
POST /v1/turns/ID/signals/NAME, POST /v1/webhooks/github|gitlab (these two:
signal-server's).
Every request carries an API token (`durable-harness token create --tenant NAME`).
The web viewer is at /ui/ (docs/viewer.md): its page needs no token, its data does.

Stateless: run as many as you like on one World (postgres, s3sqs) beside the workers.
Give it the workers' settings: it checks each new session as a worker would, with the
model endpoint (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY), the tool files and, for docker
sessions, Docker. A session names tool sets only from --tool-set /
DURABLE_HARNESS_TOOL_SETS here; the workers must register the same names. Limits per
tenant: DURABLE_HARNESS_API_TURNS_PER_MINUTE (60), DURABLE_HARNESS_API_MAX_CONCURRENT_TURNS
(10), DURABLE_HARNESS_API_MAX_BODY_BYTES (1 MiB); the listener's DURABLE_HARNESS_LISTENER_*.
"""


UI_EPILOG = """\
Serves the HTTP API and the web viewer (docs/viewer.md) over a World, by default the local
one this machine's `run` and `worker` use, on 127.0.0.1 only. At start it makes an operator
token labelled `ui` and prints it once, after the page's URL: open the URL, paste the
token into the page (it keeps it in the tab's session storage and sends it only in the
Authorization header; the URL never carries it). A clean exit (Ctrl-C, SIGTERM) revokes
the token; after a kill -9, revoke it with `durable-harness token revoke ID`
(`token list` shows it, labelled ui).

Another address than loopback must be given with --host; the page and the token then
cross the network unencrypted: put a TLS proxy in front, or use `serve` with tenant tokens.
"""

#: ``ui``'s default port: a fixed one, so a bookmark keeps working (serve's is 8788).
UI_PORT = 8789
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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

    ui = sub.add_parser(
        "ui",
        help="the web viewer (and the API) for a local World on 127.0.0.1 (docs/viewer.md)",
        description="Look at sessions and turns in a browser: timelines, steps, costs.",
        epilog=UI_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=int, default=UI_PORT, help=f"port (default {UI_PORT}; 0: a free one)"
    )
    world_flags(ui)
    policy_flags(ui)

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
    return {"serve": cmd_serve, "ui": cmd_ui, "token": cmd_token}


def cmd_serve(args: argparse.Namespace) -> int:
    from durable_harness.runtime.telemetry import export_metrics
    from durable_harness.server import serve

    settings = settings_of(args)
    with open_configured(settings) as world, export_metrics(world):
        serve(world, settings, args.host, args.port)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from durable_harness.runtime.telemetry import export_metrics
    from durable_harness.server import serve
    from durable_harness.server.auth import create_token

    settings = settings_of(args)
    if args.host not in LOOPBACK:
        print(
            f"ui: listening on {args.host}, beyond this machine: the page and its token "
            "travel unencrypted (docs/viewer.md)",
            file=sys.stderr,
        )
    with open_configured(settings) as world, export_metrics(world):
        token, text = create_token(world, "ui", operator=True, label="ui")

        def announce(url: str) -> None:
            print(f"ui: the viewer is at {url}/ui/")
            print(
                f"ui: paste this operator token ({token.token_id}) into the page; shown "
                "once, revoked when ui stops:"
            )
            print(text)

        try:
            serve(world, settings, args.host, args.port, announce)
        finally:
            world.revoke_token(token.token_id, time.time())
            print(f"ui: stopped; token {token.token_id} revoked", file=sys.stderr)
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
