"""CI webhooks: GitHub and GitLab results routed to the turns that wait for them.

A CI system knows a repository and a commit, not a turn. A turn (or the tool that pushed
for it: ``git_push`` does, when the turn names its CI repository) registers what it waits
for with :func:`~durable_harness.harness.ci_watch.watch_ref` (``durable-harness watch``):
repository ``github:OWNER/NAME`` or ``gitlab:GROUP/PROJECT``, and ``sha:<commit>`` or
``branch:<name>``. A new watch of the same turn, repository and signal name replaces the
last one, so a late result for an earlier push reaches no wait; and a commit watch
supersedes the turn's results of that name for other commits that no wait took yet (a
second report of the earlier push, a re-run), so the next wait gets a result for the
commit it waits on or nothing.

``signal-server`` serves ``POST /v1/webhooks/github`` and ``POST /v1/webhooks/gitlab``:

* **GitHub**: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 of the raw body with
  ``DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET``, compared in constant time before the body is
  parsed. Events ``check_suite`` and ``workflow_run`` (action ``completed``) and
  ``status`` (state other than ``pending``); ``ping`` is answered. Deduplicated by
  ``X-GitHub-Delivery``.
* **GitLab**: ``X-Gitlab-Token`` equal to ``DURABLE_HARNESS_GITLAB_WEBHOOK_TOKEN``
  (constant time); pipeline events (``object_kind: pipeline``) in a final status.
  Deduplicated by ``X-Gitlab-Event-UUID``, else by pipeline id and status.

Each result becomes one signal, a small JSON object the model reads (:class:`CIResult`),
sent to every turn that watches the commit or the branch. The answer is 202 whether or
not a turn watches: the sender learns nothing about turns. A bad or missing signature is
401 and records nothing; an endpoint whose secret is not configured is 404.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from durable_harness.core.canonical import parse_json
from durable_harness.core.world import World
from durable_harness.harness.ci_watch import scope_of
from durable_harness.harness.events import signal_received

PROVIDERS = ("github", "gitlab")

#: GitLab pipeline statuses that end a pipeline (the others: created, pending, running, ...).
GITLAB_FINAL = frozenset({"success", "failed", "canceled", "skipped"})


@dataclass(frozen=True)
class CIResult:
    """What a waiting turn receives: one finished CI run of one commit."""

    provider: str
    event: str
    repo: str  # OWNER/NAME as the provider spells it
    sha: str
    branches: tuple[str, ...]
    status: str  # success, failure, ... (GitHub's conclusion or state; GitLab's status)
    name: str  # the workflow, check suite app, status context or pipeline name
    url: str

    @property
    def scope(self) -> str:
        return scope_of(self.provider, self.repo)

    @property
    def refs(self) -> list[str]:
        return [f"sha:{self.sha.lower()}", *(f"branch:{b}" for b in self.branches)]

    def payload(self) -> str:
        data = asdict(self)
        data["branches"] = list(self.branches)
        return json.dumps(data, sort_keys=True)


class Refused(Exception):
    """A webhook request answered with ``status`` and nothing recorded."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def authenticate(provider: str, secret: str, headers: Mapping[str, str], body: bytes) -> None:
    """Raise :class:`Refused` unless the request carries the provider's proof of the
    operator's secret. Runs on the raw bytes, before anything parses them."""
    if not secret:
        raise Refused(404, f"{provider} webhooks are not configured on this server")
    if provider == "github":
        given = headers.get("x-hub-signature-256", "")
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    else:
        given, expected = headers.get("x-gitlab-token", ""), secret
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
        raise Refused(401, f"bad or missing {provider} webhook signature")


def parse(provider: str, headers: Mapping[str, str], body: bytes) -> tuple[CIResult | None, str]:
    """The finished CI run the (authenticated) request reports, or None for an event that
    reports none (a ping, a run still going); and its delivery id."""
    try:
        data = parse_json(body)
    except ValueError as exc:
        raise Refused(400, f"the body is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise Refused(400, "the body is not a JSON object")
    try:
        if provider == "github":
            event = headers.get("x-github-event", "")
            return _github(event, data), headers.get("x-github-delivery", "")
        result = _gitlab(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise Refused(400, f"the {provider} payload lacks a field it must have: {exc}") from exc
    delivery = headers.get("x-gitlab-event-uuid", "")
    if not delivery and result is not None:
        pipeline = data["object_attributes"].get("id")
        delivery = f"gitlab:pipeline:{pipeline}:{result.status}"
    return result, delivery


def _github(event: str, data: dict[str, Any]) -> CIResult | None:
    if event not in ("check_suite", "workflow_run", "status"):
        return None  # ping, and every event that reports no CI result (some lack a repository)
    repo = str(data["repository"]["full_name"])
    if event in ("check_suite", "workflow_run"):
        run = data[event]
        if data.get("action") != "completed":
            return None
        if event == "check_suite":
            name = str((run.get("app") or {}).get("name") or "check suite")
            url = str(run.get("url") or "")
        else:
            name, url = str(run.get("name") or "workflow"), str(run.get("html_url") or "")
        branch = run.get("head_branch")
        head = (run.get("head_repository") or {}).get("full_name")
        if head is not None and head != repo:
            # A fork's pull request: its branch name is the fork author's choice (a
            # fork's "main" is not this repository's), so it reaches only a commit watch.
            branch = None
        return CIResult(
            "github",
            event,
            repo,
            str(run["head_sha"]),
            (str(branch),) if branch else (),
            str(run.get("conclusion") or run.get("status") or "unknown"),
            name,
            url,
        )
    if event == "status":
        if data.get("state") == "pending":
            return None
        branches = tuple(str(b["name"]) for b in data.get("branches") or [])
        return CIResult(
            "github",
            event,
            repo,
            str(data["sha"]),
            branches,
            str(data["state"]),
            str(data.get("context") or "status"),
            str(data.get("target_url") or ""),
        )
    return None  # ping, and every event that reports no CI result


def _gitlab(data: dict[str, Any]) -> CIResult | None:
    if data.get("object_kind") != "pipeline":
        return None
    attrs = data["object_attributes"]
    status = str(attrs["status"])
    if status not in GITLAB_FINAL:
        return None
    ref = attrs.get("ref")
    request = data.get("merge_request") or {}
    source, target = request.get("source_project_id"), (data.get("project") or {}).get("id")
    if source is not None and source != target:
        ref = None  # a fork's merge request: as on GitHub, only a commit watch
    return CIResult(
        "gitlab",
        "pipeline",
        str(data["project"]["path_with_namespace"]),
        str(attrs["sha"]),
        (str(ref),) if ref and not attrs.get("tag") else (),
        status,
        str(attrs.get("name") or "pipeline"),
        str(attrs.get("url") or data["project"].get("web_url") or ""),
    )


def deliver(world: World, result: CIResult, delivery_id: str) -> int:
    """Send ``result`` to every turn watching its commit or branch; how many got it new."""
    targets = sorted({w for ref in result.refs for w in world.watchers(result.scope, ref)})
    delivery = delivery_id or None  # without one, the payload deduplicates
    fresh = 0
    for turn_id, name in targets:
        fresh += world.send_signal(turn_id, name, result.payload(), delivery)
        signal_received(world, turn_id, name, result.payload(), delivery)
    return fresh
