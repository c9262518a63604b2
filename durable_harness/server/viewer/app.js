// The viewer: sessions and turns, a turn's timeline, its cost and what replay saved, and
// the signal a waiting turn waits for. Plain ES modules, no build step, nothing but 'self'.
// Routes live in the URL's fragment (#/turn/<id>): ids, never the token.

import {
  ApiError,
  Unauthorized,
  followEvents,
  forgetToken,
  getJson,
  getToken,
  postJson,
  setToken,
} from "./api.js";
import { $, append, clear, el, facts, fmtInt, fmtTime, fmtUsd, short } from "./dom.js";
import { TurnModel, renderLegend, renderTimeline } from "./timeline.js";

const PAGE = 20;
const VIEWS = ["login", "lists", "session-view", "turn-view"];
const REFRESH_ON = new Set([
  "attempt.started",
  "attempt.lost",
  "step.finished",
  "step.replayed",
  "turn.waiting",
  "turn.released",
  "signal.received",
  "turn.ended",
]);

const lists = { status: "", q: "", turns: [null], sessions: [null], nextTurn: null, nextSession: null };
let leaveView = () => {};

function show(view) {
  for (const id of VIEWS) $(id).hidden = id !== view;
  $("forget-token").hidden = view === "login";
}

function say(text) {
  $("status-line").textContent = text;
}

function toLogin(message) {
  leaveView();
  leaveView = () => {};
  forgetToken();
  show("login");
  $("login-error").textContent = message || "";
  $("token-input").focus();
}

/** Runs an async view step; a 401 anywhere sends the user back to the token form. */
async function guard(work) {
  try {
    await work();
  } catch (error) {
    if (error instanceof Unauthorized) {
      toLogin("The server refused this token (401). Paste a valid one.");
    } else if (error instanceof ApiError) {
      say(`Error ${error.status}: ${error.message}`);
    } else {
      // fetch() rejects with a TypeError when the server cannot be reached (a restart):
      // said on the status line; the stream reconnects by itself, the next refresh retries.
      say(`Cannot reach the server: ${error?.message || error}`);
      console.error(error);
    }
  }
}

// -- money and tokens ----------------------------------------------------------------
function costPairs(item) {
  return [
    ["Tokens in", fmtInt(item.input_tokens)],
    ["Tokens out", fmtInt(item.output_tokens)],
    ["Cache reads", fmtInt(item.cache_read_tokens)],
    ["Cache writes", fmtInt(item.cache_write_tokens)],
    ["Cost", fmtUsd(item.cost_usd)],
    ["Model calls saved by replay", fmtInt(item.saved_model_calls)],
    ["Money saved by replay", fmtUsd(item.saved_usd)],
  ];
}

/** A session's totals: its own fields where the API gives them, else its turns' sums. */
function sessionTotals(session, turns) {
  const total = { ...session };
  for (const field of [
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "saved_model_calls",
    "cost_usd",
    "saved_usd",
  ]) {
    // Only a field the API did not send is summed here: null is its answer ("unknown",
    // e.g. calls saved that have no price), not a gap to fill with the turns' zeros.
    if (field in total) continue;
    const values = turns.map((t) => t[field]).filter((v) => typeof v === "number");
    total[field] = values.length ? values.reduce((a, b) => a + b, 0) : null;
  }
  return total;
}

// -- lists -----------------------------------------------------------------------------
function turnItem(turn) {
  return el(
    "li",
    { class: `row status-${turn.status}` },
    el(
      "a",
      { href: `#/turn/${encodeURIComponent(turn.turn_id)}`, class: "turn-link" },
      el("span", { class: "badge" }, turn.status),
      " ",
      short(turn.prompt, 90),
    ),
    el(
      "span",
      { class: "meta" },
      `${turn.turn_id} · ${fmtTime(turn.created_at)} · ${fmtInt(turn.steps)} steps · ${fmtUsd(turn.cost_usd)}`,
    ),
  );
}

function sessionItem(session) {
  return el(
    "li",
    { class: "row" },
    el(
      "a",
      { href: `#/session/${encodeURIComponent(session.session_id)}`, class: "session-link" },
      session.session_id,
    ),
    el(
      "span",
      { class: "meta" },
      `${session.agent ?? "?"} · ${session.workspace ?? "default"} · ${fmtTime(session.created_at)}` +
        (session.tenant ? ` · tenant ${session.tenant}` : ""),
    ),
  );
}

async function loadLists() {
  show("lists");
  say("Loading sessions and turns…");
  const turnCursor = lists.turns[lists.turns.length - 1];
  const sessionCursor = lists.sessions[lists.sessions.length - 1];
  const [turns, sessions] = await Promise.all([
    getJson("turns", { status: lists.status, q: lists.q, limit: PAGE, cursor: turnCursor }),
    getJson("sessions", { q: lists.q, limit: PAGE, cursor: sessionCursor }),
  ]);
  clear($("turn-list"));
  append($("turn-list"), turns.turns.map(turnItem));
  if (!turns.turns.length) append($("turn-list"), el("li", { class: "empty" }, "No turns."));
  clear($("session-list"));
  append($("session-list"), sessions.sessions.map(sessionItem));
  if (!sessions.sessions.length) append($("session-list"), el("li", { class: "empty" }, "No sessions."));
  lists.nextTurn = turns.next_cursor;
  lists.nextSession = sessions.next_cursor;
  $("turns-prev").disabled = lists.turns.length < 2;
  $("turns-next").disabled = !lists.nextTurn;
  $("sessions-prev").disabled = lists.sessions.length < 2;
  $("sessions-next").disabled = !lists.nextSession;
  say(`${turns.turns.length} turns, ${sessions.sessions.length} sessions shown`);
}

// -- a session -------------------------------------------------------------------------
async function loadSession(sessionId) {
  show("session-view");
  say("Loading the session…");
  const id = encodeURIComponent(sessionId);
  const [session, page] = await Promise.all([
    getJson(`sessions/${id}`),
    getJson(`sessions/${id}/turns`, { limit: 200 }),
  ]);
  $("session-title").textContent = `Session ${session.session_id}`;
  facts($("session-facts"), [
    ["Agent", session.agent ?? "n/a"],
    ["Workspace", session.workspace ?? "default"],
    ["Tools", session.tools?.length ? session.tools.join(", ") : "none"],
    ["Tenant", session.tenant ?? "n/a"],
    ["Created", fmtTime(session.created_at)],
  ]);
  facts($("session-cost"), costPairs(sessionTotals(session, page.turns)));
  clear($("session-turns"));
  append($("session-turns"), page.turns.map(turnItem));
  if (!page.turns.length) append($("session-turns"), el("li", { class: "empty" }, "No turns yet."));
  say(page.next_cursor ? "Showing the first 200 turns" : `${page.turns.length} turns`);
}

/** A step's recorded JSON, indented to be read; text that is not JSON (or was cut) as is. */
function readable(text, truncated) {
  if (text === null || text === undefined || truncated) return text;
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// -- a turn ----------------------------------------------------------------------------
/** The signal a waiting turn waits for, from `waiting_for` ("signal 'ci' until ..."). */
export function waitedSignal(waitingFor) {
  const match = /^signal (['"])(.*)\1 until (.+)$/.exec(waitingFor || "");
  return match ? { name: match[2], until: match[3] } : null;
}

/** The approval step a parked turn waits on, from `waiting_for`
 * ("approval of step 2 (refund) until ..."): its buttons decide it (POST .../approval). */
export function waitedApproval(waitingFor) {
  const match = /^approval of step (\d+) \((.*)\) until (.+)$/.exec(waitingFor || "");
  return match ? { seq: Number(match[1]), tool: match[2], until: match[3] } : null;
}

function openTurn(turnId) {
  show("turn-view");
  const model = new TurnModel(turnId);
  const id = encodeURIComponent(turnId);
  let stopped = false;
  let drawQueued = false;
  let refreshTimer = null;
  let hasStepRoute = true;
  let streamState = "connecting";
  clear($("timeline"));
  clear($("markers-list"));
  clear($("turn-facts"));
  clear($("turn-cost"));
  $("step-detail").hidden = true;
  $("waiting-panel").hidden = true;
  $("signal-result").textContent = "";
  $("turn-title").textContent = `Turn ${turnId}`;

  function draw() {
    if (drawQueued || stopped) return;
    drawQueued = true;
    requestAnimationFrame(() => {
      drawQueued = false;
      if (!stopped) drawNow();
    });
  }

  function drawNow() {
    const turn = model.turn;
    if (turn) {
      const status = model.turnStatus();
      facts($("turn-facts"), [
        ["Status", status],
        ["Session", el("a", { href: `#/session/${encodeURIComponent(turn.session_id)}` }, turn.session_id)],
        ["Prompt", el("span", { class: "text" }, turn.prompt)],
        ["Reply", el("span", { class: "text reply" }, turn.reply ?? model.ended?.result ?? "")],
        ["Error", turn.error ?? model.ended?.error ?? "none"],
        ["Deliveries", fmtInt(Math.max(turn.attempts ?? 0, model.deliveries.length))],
        ["Steps", fmtInt(model.steps().length)],
        ["Created", fmtTime(turn.created_at)],
        ["Finished", turn.finished_at ? fmtTime(turn.finished_at) : "not yet"],
        ["Event stream", streamState],
      ]);
      facts($("turn-cost"), costPairs(turn));
      drawWaiting(turn, status);
    }
    const text = model.text;
    $("live-text").hidden = !text;
    if (text) {
      $("live-text-title").textContent =
        `Model text of step #${text.seq}, attempt ${text.attempt}` +
        (text.abandoned ? ": abandoned (its worker died; not part of the reply)" : "");
      $("live-text-body").textContent = text.text;
    }
    renderTimeline($("timeline"), $("markers-list"), model, (seq) => guard(() => openStep(seq)));
  }

  function drawWaiting(turn, status) {
    const panel = $("waiting-panel");
    const waitingFor = status === "waiting" ? turn.waiting_for || model.waiting?.waiting_for : null;
    panel.hidden = !waitingFor;
    if (!waitingFor) return;
    const signal = waitedSignal(waitingFor);
    const wakeAt = model.waiting?.wake_at;
    $("waiting-text").textContent =
      `Waiting for ${waitingFor}` + (typeof wakeAt === "number" ? ` (wakes at ${fmtTime(wakeAt)} at the latest)` : "");
    const approval = waitedApproval(waitingFor);
    $("signal-form").hidden = !signal && !approval;
    panel.dataset.signal = signal ? signal.name : "";
    panel.dataset.approval = approval ? String(approval.seq) : "";
    $("signal-payload-field").hidden = Boolean(approval);
    $("approval-reason-field").hidden = !approval;
    const what = approval ? `run ${approval.tool} (step ${approval.seq})` : signal ? `send signal ${signal.name}` : "";
    $("signal-approve").setAttribute("aria-label", what ? `Approve: ${what}` : "Approve");
    $("signal-reject").setAttribute("aria-label", what ? `Reject: ${what}` : "Reject");
  }

  async function refresh() {
    const [turn, steps] = await Promise.all([
      getJson(`turns/${id}`),
      hasStepRoute
        ? getJson(`turns/${id}/steps`).catch((error) => {
            if (error instanceof ApiError && error.status === 404 && error.code === "not_found") {
              hasStepRoute = false; // a serve without the steps route: the events suffice
              return null;
            }
            throw error;
          })
        : null,
    ]);
    if (stopped) return;
    model.turn = turn;
    if (steps) model.setRows(steps.steps);
    drawNow();
  }

  function scheduleRefresh() {
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      guard(refresh);
    }, 250);
  }

  async function openStep(seq) {
    const panel = $("step-detail");
    panel.hidden = false;
    $("step-title").textContent = `Step #${seq}`;
    $("step-input").textContent = "loading…";
    $("step-output").textContent = "";
    clear($("step-facts"));
    let detail;
    try {
      detail = await getJson(`turns/${id}/steps/${encodeURIComponent(seq)}`);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      const live = model.live.get(seq);
      detail = { seq, kind: live?.kind, name: live?.name, status: live?.status, input: null,
        output: live?.preview ?? null, truncated: true, note: `detail unavailable (${error.status})` };
    }
    $("step-title").textContent = `Step #${detail.seq} ${detail.kind ?? ""} ${detail.name ?? ""}`;
    facts($("step-facts"), [
      ["Status", detail.status ?? "n/a"],
      ["Output size", typeof detail.output_bytes === "number" ? `${detail.output_bytes} bytes` : "n/a"],
      ["Cut at 256 KiB", detail.truncated ? "yes" : "no"],
      ...(detail.note ? [["Note", detail.note]] : []),
    ]);
    $("step-input").textContent = readable(detail.input, detail.truncated) ?? "(not stored)";
    $("step-output").textContent = readable(detail.output, detail.truncated) ?? "(no outcome recorded)";
    panel.scrollIntoView({ block: "nearest" });
  }

  const stream = followEvents(turnId, {
    onEvent(event) {
      model.apply(event);
      if (REFRESH_ON.has(event.kind)) scheduleRefresh();
      draw();
    },
    onState(state) {
      streamState = state;
      draw();
    },
    onUnauthorized() {
      toLogin("The server refused this token (401). Paste a valid one.");
    },
  });
  // While the turn runs, its running bar grows with the clock.
  const ticker = setInterval(() => {
    if (!["done", "failed", "cancelled"].includes(model.turnStatus())) draw();
  }, 1000);

  async function decide(approved, seq) {
    await guard(async () => {
      const reason = $("approval-reason").value || "";
      const answer = await postJson(`turns/${id}/steps/${seq}/approval`, { approved, reason });
      $("signal-result").textContent = answer.new
        ? `${approved ? "Approved" : "Rejected"} step ${seq}.`
        : `Step ${seq} was decided already (${answer.approved ? "approved" : "rejected"} by ${answer.by}).`;
      scheduleRefresh();
    });
  }

  async function signal(approved) {
    const seq = $("waiting-panel").dataset.approval;
    if (seq) return decide(approved, seq);
    const name = $("waiting-panel").dataset.signal;
    let payload;
    try {
      payload = JSON.parse($("signal-payload").value || "null");
    } catch (error) {
      $("signal-result").textContent = `The payload is not JSON: ${error.message}`;
      return;
    }
    await guard(async () => {
      const answer = await postJson(`turns/${id}/signals/${encodeURIComponent(name)}`, { approved, payload });
      $("signal-result").textContent = answer.new
        ? `Sent signal ${name} (${approved ? "approved" : "rejected"}).`
        : `Signal ${name} was already sent with this payload.`;
      scheduleRefresh();
    });
  }
  const approve = () => signal(true);
  const reject = () => signal(false);
  const close = () => {
    $("step-detail").hidden = true;
  };
  $("signal-approve").addEventListener("click", approve);
  $("signal-reject").addEventListener("click", reject);
  $("step-close").addEventListener("click", close);

  leaveView = () => {
    stopped = true;
    stream.stop();
    clearInterval(ticker);
    clearTimeout(refreshTimer);
    $("signal-approve").removeEventListener("click", approve);
    $("signal-reject").removeEventListener("click", reject);
    $("step-close").removeEventListener("click", close);
  };
  say("Loading the turn…");
  return guard(async () => {
    await refresh();
    say(`Turn ${turnId}`);
  });
}

// -- routing ---------------------------------------------------------------------------
function route() {
  leaveView();
  leaveView = () => {};
  if (!getToken()) {
    show("login");
    return;
  }
  const [, kind, id] = /^#\/(turn|session)\/(.+)$/.exec(location.hash) || [];
  if (kind === "turn") openTurn(decodeURIComponent(id));
  else if (kind === "session") guard(() => loadSession(decodeURIComponent(id)));
  else guard(loadLists);
}

function start() {
  renderLegend($("legend"));
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    $("token-input").value = "";
    if (!token) return;
    setToken(token);
    $("login-error").textContent = "";
    route();
  });
  $("forget-token").addEventListener("click", () => toLogin("Token forgotten."));
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    lists.status = $("status-filter").value;
    lists.q = $("search-input").value.trim();
    lists.turns = [null];
    lists.sessions = [null];
    if (location.hash && location.hash !== "#/") location.hash = "#/";
    else guard(loadLists);
  });
  $("status-filter").addEventListener("change", () => $("filters").requestSubmit());
  $("refresh-lists").addEventListener("click", () => guard(loadLists));
  $("turns-next").addEventListener("click", () => {
    lists.turns.push(lists.nextTurn);
    guard(loadLists);
  });
  $("turns-prev").addEventListener("click", () => {
    lists.turns.pop();
    guard(loadLists);
  });
  $("sessions-next").addEventListener("click", () => {
    lists.sessions.push(lists.nextSession);
    guard(loadLists);
  });
  $("sessions-prev").addEventListener("click", () => {
    lists.sessions.pop();
    guard(loadLists);
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
