"""Host tools: what a user declares, and how they are loaded and checked.

A tool declares its name, description, input schema (a pydantic model or a JSON schema),
its **replay** rule and the function (invariant 4):

* ``replay="safe"``: running it again after an interruption is harmless (a lookup, an
  idempotent write); an interrupted call simply runs again.
* ``replay="never"``: it must not run twice (a refund, an email, a deploy); if it was
  interrupted, the model is told it *possibly ran* and must check before retrying.

There is no default: a tool without a label is refused, naming the tool.

A tool may also declare ``approval``: ``"required"`` (every call waits for a human's
decision) or a rule over its validated arguments (``lambda a: a.amount > 100``: the calls it
answers True for wait). A gated call parks the turn on an approval step before it runs
(:mod:`.approval`); a rejection is the result the model sees, and the tool never runs.

A ``never`` tool may declare a **check** (``check=fn``, called as ``fn(args, ctx)`` with
the same arguments and the step's idempotency key): when a delivery finds the tool's
intent without an outcome, the harness asks the check before the model hears anything
(:meth:`.journal.Journal.run`). It answers :func:`done` with the result the tool would have
returned (the step is finished with it: the model never sees *possibly ran*),
:data:`ABSENT` (the effect did not happen) or :data:`UNKNOWN`; a check that raises counts
as unknown. Absent lets the tool run again, with the same key, only when it also declares
``idempotent=True`` (its downstream honours the key, so an earlier attempt still in flight
cannot land a second time); otherwise absent and unknown are *possibly ran*, as today.

The function is called as ``fn(args, ctx)`` (or ``fn(args)``), where ``args`` is the
validated pydantic model (or a dict for a JSON-schema tool) and ``ctx`` a
:class:`ToolContext` carrying the step's idempotency key ``<turn_id>:<seq>`` (invariant 5),
the same on every retry of that step: hand it to the downstream API.
"""

from __future__ import annotations

import importlib.util
import inspect
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from durable_harness.core.errors import ToolDefinitionError, ToolExited
from durable_harness.core.keys import idempotency_key
from durable_harness.core.types import REPLAY_RULES, Replay

T = TypeVar("T")

#: A tool's ``approval``: None (no human in the loop), ``"required"`` (every call), or a
#: rule over the validated arguments (True: this call needs a human's decision).
Approval = str | Callable[[Any], bool] | None
APPROVAL_REQUIRED = "required"


#: What a tool's check answers (see the module docstring).
CheckState = Literal["done", "absent", "unknown"]


@dataclass(frozen=True)
class Checked:
    """A check's answer: ``state``, and for ``done`` the result the model is given."""

    state: CheckState
    result: Any = None


def done(result: Any) -> Checked:
    """The check found the effect: ``result`` is what the tool returned (or would have)."""
    return Checked("done", result)


ABSENT = Checked("absent")
UNKNOWN = Checked("unknown")


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about its step."""

    turn_id: str
    session_id: str
    seq: int
    signal_secret: str = ""  # the turn's webhook secret (see ``signal_url``)

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this step: ``<turn_id>:<seq>``."""
        return idempotency_key(self.turn_id, self.seq)

    def signal_url(self, name: str, base_url: str) -> str:
        """Where an outside system (a CI job) POSTs signal ``name`` for this turn, given
        the signal server's base URL. Send ``Authorization: Bearer <signal_secret>``."""
        return f"{base_url.rstrip('/')}/v1/turns/{self.turn_id}/signals/{name}"


class ToolInputError(ValueError):
    """The model sent input that does not match the tool's schema (a tool error result)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: type[BaseModel] | dict[str, Any]
    replay: Replay
    fn: Callable[..., Any]
    approval: Approval = None
    #: Asked, for a ``never`` tool, whether an interrupted call took effect.
    check: Callable[..., Checked] | None = None
    #: The tool's downstream honours the idempotency key: an absent call may run again.
    idempotent: bool = False

    def __post_init__(self) -> None:
        check_replay(self.name, self.replay)
        check_approval(self.name, self.approval)
        check_settle(self.name, self.replay, self.check, self.idempotent)
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ToolDefinitionError(
                f"tool name {self.name!r} is invalid: use letters, digits, '_' or '-'"
            )
        if not callable(self.fn):
            raise ToolDefinitionError(f"tool {self.name!r}: fn is not callable")
        if not (
            isinstance(self.input_schema, dict)
            or (isinstance(self.input_schema, type) and issubclass(self.input_schema, BaseModel))
        ):
            raise ToolDefinitionError(
                f"tool {self.name!r}: input_schema must be a pydantic model or a JSON schema dict"
            )

    def json_schema(self) -> dict[str, Any]:
        if isinstance(self.input_schema, dict):
            return self.input_schema
        return self.input_schema.model_json_schema()

    def anthropic_spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.json_schema(),
        }

    def parse_input(self, raw: dict[str, Any]) -> Any:
        if isinstance(self.input_schema, dict):
            return raw
        try:
            return self.input_schema.model_validate(raw)
        except ValidationError as exc:
            raise ToolInputError(f"invalid input for {self.name}: {exc}") from exc

    def invoke(self, raw: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the tool; a ``sys.exit()`` in it raises :class:`ToolExited` (see
        :func:`contained`), so every caller's ``except Exception`` makes it the result."""
        args = self.parse_input(raw)
        if len(inspect.signature(self.fn).parameters) >= 2:
            return contained(f"tool {self.name!r}", self.fn, args, ctx)
        return contained(f"tool {self.name!r}", self.fn, args)

    def settle(self, raw: dict[str, Any], ctx: ToolContext) -> Checked:
        """Ask the tool's check about the interrupted call ``raw`` of step ``ctx.seq``;
        whatever it raises or returns that is not a :class:`Checked` is an error here
        (the journal records the step as *possibly ran*)."""
        if self.check is None:
            return UNKNOWN
        args = self.parse_input(raw)
        what = f"the check of tool {self.name!r}"
        if len(inspect.signature(self.check).parameters) >= 2:
            answer = contained(what, self.check, args, ctx)
        else:
            answer = contained(what, self.check, args)
        if not isinstance(answer, Checked):
            raise ToolDefinitionError(
                f"the check of tool {self.name!r} returned {type(answer).__name__}, not "
                "done(result), ABSENT or UNKNOWN"
            )
        return answer


def contained(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` from a user's tools file, where a BaseException that is not an
    Exception (``sys.exit()``, ``raise KeyboardInterrupt``, a ``BaseException`` subclass)
    becomes :class:`ToolExited`: the tools file is the user's code, run by a worker that
    must outlive it. A Ctrl-C the worker really received while ``fn`` ran (SIGINT, seen
    in the main thread only) still interrupts: that one is the operator's, and recording it
    as the tool's failure would tell the model a call failed that may have taken effect.
    ``GeneratorExit`` passes (it is Python's own). ``os._exit`` cannot be caught in-process.
    """
    with _SigintWatch() as watch:
        try:
            return fn(*args)
        except (Exception, GeneratorExit):
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and watch.received:
                raise
            raise ToolExited(
                f"{what} raised {type(exc).__name__}{_args_text(exc)}: a tools file may not "
                "exit or interrupt the worker"
            ) from exc


def _args_text(exc: BaseException) -> str:
    return f"({', '.join(repr(a) for a in exc.args)})"


class _SigintWatch:
    """Notes whether SIGINT arrives while installed (main thread only: Python runs signal
    handlers there, so a KeyboardInterrupt in another thread is never a real Ctrl-C)."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _SigintWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            # None: a handler not set from Python, which could not be put back after.
            if self._previous is not None:
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


def check_replay(name: str, replay: object) -> None:
    if replay not in REPLAY_RULES:
        raise ToolDefinitionError(
            f"tool {name!r} has no valid replay label (got {replay!r}): declare "
            "replay='safe' if running it twice is harmless, or replay='never' if it has a "
            "side effect that must not repeat"
        )


def check_approval(name: str, approval: object) -> None:
    if approval is None or approval == APPROVAL_REQUIRED or callable(approval):
        return
    raise ToolDefinitionError(
        f"tool {name!r}: approval must be 'required' or a function of the tool's arguments "
        f"that returns True when a call needs a human's decision (got {approval!r})"
    )


def check_settle(name: str, replay: object, check: object, idempotent: object) -> None:
    if check is not None and not callable(check):
        raise ToolDefinitionError(f"tool {name!r}: check must be a function (got {check!r})")
    if check is not None and replay != "never":
        raise ToolDefinitionError(
            f"tool {name!r}: only a replay='never' tool takes a check (a safe one simply "
            "runs again)"
        )
    if idempotent is not True and idempotent is not False:
        raise ToolDefinitionError(f"tool {name!r}: idempotent must be True or False")
    if idempotent and check is None:
        raise ToolDefinitionError(
            f"tool {name!r}: idempotent=True says an absent call may run again, which only "
            "a check can find out; declare check= (or label the tool replay='safe')"
        )


def tool(
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
    input_schema: type[BaseModel] | dict[str, Any] | None = None,
    approval: Approval = None,
    check: Callable[..., Checked] | None = None,
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]:
    """Decorator: ``@tool(replay="never")`` over ``def refund(args: RefundArgs, ctx): ...``.

    The schema defaults to the annotation of the first parameter, the description to the
    docstring. ``approval``, ``check`` and ``idempotent``: see the module docstring.
    """

    def wrap(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        check_replay(tool_name, replay)
        schema = input_schema
        if schema is None:
            params = list(inspect.signature(fn, eval_str=True).parameters.values())
            schema = params[0].annotation if params else None
            if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
                raise ToolDefinitionError(
                    f"tool {tool_name!r}: annotate the first parameter with a pydantic "
                    "model or pass input_schema="
                )
        return Tool(
            name=tool_name,
            description=description or inspect.getdoc(fn) or tool_name,
            input_schema=schema,
            replay=replay,
            fn=fn,
            approval=approval,
            check=check,
            idempotent=idempotent,
        )

    return wrap


def coerce_tool(obj: object, origin: str) -> Tool:
    """Accept a :class:`Tool` or a dict with the same fields; refuse anything unlabelled."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, dict):
        name = str(obj.get("name") or "<unnamed>")
        if "replay" not in obj:
            check_replay(name, None)
        try:
            return Tool(
                name=name,
                description=str(obj.get("description", name)),
                input_schema=obj.get("input_schema", {"type": "object"}),
                replay=obj["replay"],
                fn=obj["fn"],
                approval=obj.get("approval"),
                check=obj.get("check"),
                idempotent=obj.get("idempotent", False),
            )
        except KeyError as exc:
            raise ToolDefinitionError(f"tool {name!r} in {origin}: missing {exc}") from exc
    name = getattr(obj, "__name__", repr(obj))
    raise ToolDefinitionError(
        f"{origin}: {name!r} is not a tool; wrap it with @tool(replay='safe'|'never')"
    )


class ToolRegistry:
    """The tools a turn offers, by name. Names are unique."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ToolDefinitionError(f"tool {t.name!r} is defined twice")
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def load_tools(spec: str) -> list[Tool]:
    """Load ``path/to/file.py:NAME`` where NAME is a list of tools in that file."""
    path_text, sep, attr = spec.rpartition(":")
    if not sep or not path_text or not attr:
        raise ToolDefinitionError(
            f"--tools {spec!r}: expected path/to/file.py:NAME (NAME is a list of tools)"
        )
    path = Path(path_text)
    if not path.is_file():
        raise ToolDefinitionError(f"--tools {spec!r}: cannot read {path} (no such file)")
    module_name = f"durable_harness_user_tools_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ToolDefinitionError(f"--tools {spec!r}: {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        contained(f"importing {path}", module_spec.loader.exec_module, module)
    except Exception as exc:  # the user's file: any error is theirs to fix
        raise ToolDefinitionError(
            f"--tools {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        raise ToolDefinitionError(f"--tools {spec!r}: {path} defines no {attr!r}")
    items = getattr(module, attr)
    if isinstance(items, (Tool, dict)) or not isinstance(items, Iterable):
        raise ToolDefinitionError(f"--tools {spec!r}: {attr} must be a list of tools")
    return [coerce_tool(item, f"{path}:{attr}") for item in items]


def load_user_tools(specs: Iterable[str], taken: Iterable[str] = ()) -> list[Tool]:
    """The tools of every ``--tools`` spec. :class:`ToolDefinitionError` when two share a
    name, or one takes the name of a tool the agent already has (``taken``): the model
    calls a tool by name, and which of two would run must not depend on load order."""
    owners = dict.fromkeys(taken, "the agent's own tools")
    found: list[Tool] = []
    for spec in specs:
        for t in load_tools(spec):
            if t.name in owners:
                raise ToolDefinitionError(
                    f"--tools {spec!r}: tool {t.name!r} is already defined by "
                    f"{owners[t.name]}; rename it"
                )
            owners[t.name] = f"--tools {spec!r}"
            found.append(t)
    return found
