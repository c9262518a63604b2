"""The built-in agent: an Anthropic Messages loop whose every call is a journal step.

Step keys are ordinals: ``model:<n>`` for the n-th model call of the turn and
``tool:<n>:<tool_use_id>`` for its tool calls (the id comes from the recorded model reply,
so it is the same on replay). The conversation of earlier turns of the session is rebuilt
from their journals, never from memory, so any worker can continue a session.

Nothing that changes between runs enters a request (invariant 6): the system prompt is
constant, the tool list is ordered, the workspace state comes from the journal.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pydantic import BaseModel, Field

from durable_harness.adapters.base import Adapter, TurnRun
from durable_harness.adapters.push_tool import GIT_PUSH, push_tools
from durable_harness.core.canonical import canonical_json
from durable_harness.core.errors import SandboxError, SandboxUnavailable, TurnFailed, TurnSuspended
from durable_harness.core.fork import Cut, load_fork
from durable_harness.core.keys import ordinal_model_key, ordinal_tool_key
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER, VIRTUAL, TurnConfig
from durable_harness.core.types import Replay, Step, StepStatus, Turn, TurnStatus
from durable_harness.core.usage import anthropic_usage, model_of
from durable_harness.core.world import World
from durable_harness.harness.approval import (
    APPROVAL_KIND,
    Decision,
    approval_call,
    approval_input,
    approval_key,
    needs_approval,
    rejection_value,
)
from durable_harness.harness.endpoint import resolve_endpoint
from durable_harness.harness.journal import Journal, Outcome, decode_output
from durable_harness.harness.model import ModelClient
from durable_harness.harness.tools import Tool, ToolContext, ToolInputError, load_user_tools
from durable_harness.harness.waits import WAIT_TOOL_NAMES, wait_tools
from durable_harness.harness.workspace import (
    SnapshotStore,
    restore_workspace,
    save_workspace,
    session_snapshot,
    snapshot_failed,
)
from durable_harness.sandbox import open_sandbox

SYSTEM_PROMPT = (
    "You are a careful coding agent. You work in a workspace through the read, write, edit "
    "and bash tools, and may call the other tools you are given. Tools marked as having "
    "side effects must not be repeated blindly: if a result says a call possibly ran, check "
    "the current state before calling it again. Reply with a short summary when done."
)


class ReadArgs(BaseModel):
    path: str = Field(description="file path, relative to the workspace root")


class WriteArgs(BaseModel):
    path: str = Field(description="file path, relative to the workspace root")
    content: str = Field(description="the whole new content of the file")


class EditArgs(BaseModel):
    path: str = Field(description="file path, relative to the workspace root")
    old_string: str = Field(description="exact text to replace; must occur exactly once")
    new_string: str = Field(description="replacement text")


class BashArgs(BaseModel):
    command: str = Field(description="a bash command line")
    timeout: float = Field(default=60.0, description="seconds before the command is stopped")


#: The names of :func:`workspace_tools`: a user's tool may not take them.
WORKSPACE_TOOL_NAMES = ("read", "write", "edit", "bash")


def workspace_tools(sandbox: Sandbox) -> list[Tool]:
    """read/write/edit/bash over ``sandbox``.

    In a journaled sandbox every effect lives in memory that dies with the process and is
    restored from the journal, so all four replay as ``safe``. On a host folder only read
    and write (same content again) are safe; edit and bash must not run twice.
    """
    mutating: Replay = "safe" if sandbox.journaled else "never"

    def read(args: ReadArgs) -> str:
        return sandbox.read(args.path)

    def write(args: WriteArgs) -> str:
        sandbox.write(args.path, args.content)
        return f"wrote {len(args.content.encode())} bytes to {args.path}"

    def edit(args: EditArgs) -> str:
        sandbox.edit(args.path, args.old_string, args.new_string)
        return f"edited {args.path}"

    def bash(args: BashArgs) -> str:
        r = sandbox.bash(args.command, timeout=args.timeout)
        status = "timed out" if r.timed_out else f"exit code {r.exit_code}"
        parts = [status]
        if r.stdout:
            parts.append(r.stdout)
        if r.stderr:
            parts.append("stderr:\n" + r.stderr)
        return "\n".join(parts)

    return [
        Tool("read", "Read a text file of the workspace.", ReadArgs, "safe", read),
        Tool("write", "Create or overwrite a file of the workspace.", WriteArgs, "safe", write),
        Tool("edit", "Replace one exact occurrence of text in a file.", EditArgs, mutating, edit),
        Tool("bash", "Run a bash command in the workspace.", BashArgs, mutating, bash),
    ]


def open_turn_sandbox(
    config: dict[str, Any], settings: Settings, session_id: str | None = None
) -> Sandbox:
    """The turn's sandbox. Docker's is the session's container (``session_id`` None only
    checks that Docker and the image are there: nothing is created)."""
    turn = TurnConfig.of(config)
    spec = turn.workspace
    if spec == VIRTUAL:
        return open_sandbox(
            spec,
            max_files=settings.max_files if turn.max_files is None else turn.max_files,
            max_bytes=settings.max_bytes if turn.max_bytes is None else turn.max_bytes,
        )
    if spec == DOCKER:
        return open_sandbox(spec, session_id=session_id, toolchain=turn.image)
    return open_sandbox(spec)


def text_of(content: list[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def assistant_content(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The reply's blocks as the API accepts them back in ``messages``."""
    blocks: list[dict[str, Any]] = []
    for b in message.get("content", []):
        if b.get("type") == "text":
            blocks.append({"type": "text", "text": b.get("text", "")})
        elif b.get("type") == "tool_use":
            blocks.append(
                {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]}
            )
        else:
            blocks.append(b)
    return blocks


def tool_result_block(tool_use_id: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": str(value.get("content", "")),
        "is_error": bool(value.get("is_error", False)),
    }


def possibly_ran_value(message: str) -> dict[str, Any]:
    return {"content": message, "is_error": True}


def conversation_from_journal(world: World, prompt: str, steps: list[Step]) -> list[dict[str, Any]]:
    """Rebuild a finished turn's messages from its journal rows (model replies, tool results).
    An empty ``prompt`` (a fork's turn without a new prompt) adds no message of its own."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}] if prompt else []
    results: list[dict[str, Any]] = []
    for step in steps:
        value = decode_output(world, step)
        if step.kind == "model":
            if results:
                messages.append({"role": "user", "content": results})
                results = []
            messages.append({"role": "assistant", "content": assistant_content(value)})
        elif step.kind == "tool":
            tool_use_id = step.key.split(":", 2)[2]
            if step.status is StepStatus.POSSIBLY_RAN:
                value = possibly_ran_value(value)
            results.append(tool_result_block(tool_use_id, value))
    if results:
        messages.append({"role": "user", "content": results})
    return messages


@dataclass
class _SessionStart:
    history: list[dict[str, Any]]
    workspace: str | None  # snapshot digest the turn starts from


def session_start(world: World, session_id: str, turn_index: int) -> _SessionStart:
    """History from the session's earlier turns that are done or cancelled (what a
    cancelled one finished), after the conversation a forked session began with; the
    workspace they left (or the session's seed, or its fork point's)."""
    fork = load_fork(world, world, session_id)
    history: list[dict[str, Any]] = [] if fork is None else list(fork.history)
    for turn in world.list_turns(session_id):
        if turn.index >= turn_index or turn.status not in CONTINUED:
            continue
        steps = world.load_steps(turn.turn_id)
        if turn.status is TurnStatus.CANCELLED:
            steps = [s for s in steps if s.status is not StepStatus.INTENT]
            if not any(s.kind == "model" for s in steps):
                continue  # cancelled before the model said anything: nothing to continue
            messages = conversation_from_journal(world, turn.prompt, steps)
            note = f"not run: the turn was cancelled ({turn.error or 'cancelled'})"
            history.extend(close_unanswered(messages, note))
        else:
            history.extend(conversation_from_journal(world, turn.prompt, steps))
    return _SessionStart(history, session_snapshot(world, session_id, turn_index))


#: The result a fork gives the tool uses its cut left without one.
FORKED_NOTE = (
    "not run: the session was forked before this call (durable-harness fork); the "
    "workspace is as it was before it"
)

#: The statuses of the earlier turns a session's next turn continues from.
CONTINUED = (TurnStatus.DONE, TurnStatus.CANCELLED)


def close_unanswered(messages: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """``messages`` of a cancelled or forked turn, with a result for each tool use of its
    last reply that never ran (the API refuses a tool use without one): ``note``."""
    at = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if at is None:
        return messages
    asked = [b["id"] for b in messages[at]["content"] if b.get("type") == "tool_use"]
    after = messages[at + 1 :]  # at most the user message of the results that came
    answered = {b.get("tool_use_id") for m in after for b in m["content"]}
    result = {"content": note, "is_error": True}
    missing = [tool_result_block(i, result) for i in asked if i not in answered]
    if not missing:
        return messages
    results = [b for m in after for b in m["content"]]
    return [*messages[: at + 1], {"role": "user", "content": [*results, *missing]}]


class BuiltinAdapter(Adapter):
    name = "builtin"

    def check(self, config: dict[str, Any], settings: Settings) -> None:
        turn = TurnConfig.of(config)
        resolve_endpoint(turn.base_url)
        load_user_tools(turn.tools, [*WORKSPACE_TOOL_NAMES, *WAIT_TOOL_NAMES, GIT_PUSH])
        open_turn_sandbox(config, settings).close()

    def fork_cut(self, world: World, turn: Turn, steps: list[Step], session_id: str) -> Cut:
        """The session's conversation before ``turn``, then the turn's prompt and its
        ``steps`` (the finished ones before the fork point), each tool use of the last
        reply that has no result there answered *not run* (it is after the cut)."""
        start = session_start(world, turn.session_id, turn.index)
        messages = conversation_from_journal(world, turn.prompt, steps)
        return Cut(history=[*start.history, *close_unanswered(messages, FORKED_NOTE)])

    def run_turn(self, run: TurnRun) -> str:
        config = run.config
        settings = run.settings
        world = run.world
        start = session_start(world, run.turn.session_id, run.turn.index)
        sandbox = open_turn_sandbox(config, settings, run.turn.session_id)
        try:
            return _Loop(run, sandbox, start).run()
        finally:
            sandbox.close()


class _Loop:
    def __init__(self, run: TurnRun, sandbox: Sandbox, start: _SessionStart) -> None:
        self.run_ = run
        self.journal: Journal = run.journal
        self.sandbox = sandbox
        self.snapshots = SnapshotStore(run.world)
        turn, settings = TurnConfig.of(run.config), run.settings
        tools = workspace_tools(sandbox) + wait_tools(run.world, run.journal)
        tools += push_tools(
            turn,
            lambda: nullcontext(sandbox),
            settings.push_max_bytes,
            run.world,
            settings.push_branches,
        )
        tools += load_user_tools(turn.tools, [t.name for t in tools])
        self.tools = {t.name: t for t in tools}
        self.model = turn.model or settings.model
        self.max_tokens = settings.max_tokens if turn.max_tokens is None else turn.max_tokens
        self.max_calls = (
            settings.max_model_calls if turn.max_model_calls is None else turn.max_model_calls
        )
        self.base_url = turn.base_url
        self._client: ModelClient | None = None
        prompt = run.turn.prompt  # empty: a fork's turn that continues without a new one
        self.messages = [*start.history, *([{"role": "user", "content": prompt}] if prompt else [])]
        # The newest snapshot: this turn's own last finished tool step, else where the
        # session's previous turn left the workspace. A container's workspace that still
        # holds it is kept as it is.
        digest = self.journal.latest_meta("workspace") or start.workspace
        restore_workspace(sandbox, self.snapshots, None if digest is None else str(digest))
        if turn.setup is not None:  # run --setup: once per container
            from durable_harness.adapters.cli.setup import ensure_setup

            ensure_setup(sandbox, turn, settings)

    @property
    def client(self) -> ModelClient:
        # Created on first live call: a fully replayed turn needs no endpoint at all.
        if self._client is None:
            self._client = ModelClient(self.base_url)
        return self._client

    def run(self) -> str:
        try:
            for n in range(self.max_calls):
                request = {
                    "model": self.model,
                    "max_tokens": self.max_tokens,
                    "system": SYSTEM_PROMPT,
                    "tools": [t.anthropic_spec() for t in self.tools.values()],
                    "messages": self.messages,
                }
                reply = self.journal.run(
                    kind="model",
                    name=self.model,
                    key=ordinal_model_key(n),
                    input=request,
                    call=lambda seq, req=request: self._call_model(req, seq),  # type: ignore[misc]
                    replay="safe",
                    store_input=False,
                ).value
                content = assistant_content(reply)
                self.messages.append({"role": "assistant", "content": content})
                tool_uses = [b for b in content if b.get("type") == "tool_use"]
                if not tool_uses:
                    return text_of(content)
                self.messages.append(
                    {"role": "user", "content": [self._run_tool(n, b) for b in tool_uses]}
                )
            raise TurnFailed(
                f"the agent made {self.max_calls} model calls without finishing; raise "
                "--max-model-calls or split the task"
            )
        finally:
            if self._client is not None:
                self._client.close()

    def _call_model(self, request: dict[str, Any], seq: int) -> Outcome:
        events = self.journal.events
        # With an event log to write, the reply streams: its text reaches the log (and an
        # app following the turn) while the model is still writing.
        on_text = None if events is None else partial(events.text, seq)
        reply = self.client.create(request, on_text=on_text)
        usage = reply.get("usage")
        meta = {
            "model": model_of(reply, str(request["model"])),
            **anthropic_usage(usage if isinstance(usage, dict) else {}),
        }
        return Outcome(reply, meta)

    def _run_tool(self, n: int, block: dict[str, Any]) -> dict[str, Any]:
        name = str(block["name"])
        tool = self.tools.get(name)
        raw = block.get("input", {})
        key = ordinal_tool_key(n, block["id"])
        call = self._tool_call(tool, name, raw)
        replay: Replay = tool.replay if tool is not None else "safe"
        settle = None
        if tool is not None and tool.check is not None:
            turn = self.run_.turn
            secret = TurnConfig.of(turn.config).signal_secret or ""
            settle = partial(
                _ask_check, tool, raw, ToolContext(turn.turn_id, turn.session_id, 0, secret)
            )
        if tool is not None and needs_approval(tool, raw):
            decision = self._approval(key, name, raw)
            if not decision.approved:
                # The tool never runs: its step records the rejection, which is all the
                # call does (so it is ``safe`` to run again after a crash).
                rejected = rejection_value(name, decision)
                call = lambda _seq: Outcome(rejected, {"approval": "rejected"})  # noqa: E731
                replay, settle = "safe", None
        result = self.journal.run(
            kind="tool",
            name=name,
            key=key,
            input=raw,
            call=call,
            replay=replay,
            settle=settle,
            rerun_if_absent=tool is not None and tool.idempotent,
        )
        value = result.value
        if result.status is StepStatus.POSSIBLY_RAN:
            value = possibly_ran_value(value)
        return tool_result_block(str(block["id"]), value)

    def _approval(self, key: str, name: str, raw: Any) -> Decision:
        """The decision on this call, from its approval step (parks the turn until one
        is recorded: :mod:`durable_harness.harness.approval`)."""
        decided = self.journal.run(
            kind=APPROVAL_KIND,
            name=name,
            key=approval_key(key),
            input=approval_input(name, raw),
            call=partial(approval_call, self.run_.world, self.journal, name),
            replay="safe",
        )
        return Decision.of(decided.value)

    def _tool_call(
        self, tool: Tool | None, name: str, raw: dict[str, Any]
    ) -> Callable[[int], Outcome]:
        turn = self.run_.turn

        def call(seq: int) -> Outcome:
            if tool is None:
                value: dict[str, Any] = {"content": f"unknown tool {name!r}", "is_error": True}
            else:
                secret = TurnConfig.of(turn.config).signal_secret or ""
                ctx = ToolContext(turn.turn_id, turn.session_id, seq, secret)
                try:
                    out = tool.invoke(raw, ctx)
                    value = _content(out)
                except (TurnSuspended, SandboxUnavailable):
                    raise  # not a tool failure: the worker parks or retries the turn
                except (SandboxError, ToolInputError) as exc:
                    value = {"content": str(exc), "is_error": True}
                except Exception as exc:  # a host tool's failure is its result
                    value = {"content": f"{type(exc).__name__}: {exc}", "is_error": True}
            meta: dict[str, Any] = {}
            try:
                digest = save_workspace(self.sandbox, self.snapshots)
            except SandboxError as exc:
                # The agent's workspace cannot be snapshotted (too big, too deep): the call
                # stands, the model is told, and a lost container comes back as the last
                # snapshot until it fixes it; a retry would fail the same way.
                value = {**value, "is_error": True}
                value["content"] = f"{value['content']}\n\n{snapshot_failed(exc)}"
                meta["snapshot_error"] = str(exc)
                digest = None
            if digest is not None:
                meta["workspace"] = digest
            return Outcome(value, meta)

        return call


def _ask_check(tool: Tool, raw: dict[str, Any], ctx: ToolContext, seq: int) -> Any:
    """The check of ``tool``'s interrupted call at ``seq`` (``ctx`` the tool's own, at that
    seq); a ``done`` result is given to the model as the tool's own output would be."""
    checked = tool.settle(raw, replace(ctx, seq=seq))
    return replace(checked, result=_content(checked.result)) if checked.state == "done" else checked


def _content(out: Any) -> dict[str, Any]:
    """A host tool's return value as the tool result the model is given."""
    return {"content": out if isinstance(out, str) else _jsonish(out)}


def _jsonish(value: Any) -> str:
    try:
        return canonical_json(value)
    except TypeError:
        return str(value)
