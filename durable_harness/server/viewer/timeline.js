// A turn's timeline: every step a bar on one time axis, its state in colour AND in text,
// deliveries (attempt.started) and worker deaths (attempt.lost) marked on the axis.
//
// Two sources, merged: the journal's step rows (GET /v1/turns/{id}/steps: how each step's
// outcome was obtained) and the turn's event log (the stream: deliveries, deaths, read-
// backs, and the steps of a running turn before the next read of the rows).

import { append, clear, el, fmtSeconds, fmtTime, short } from "./dom.js";

/** The states a bar can be in: [state, legend text, what it means]. */
export const STATES = [
  ["live", "live", "ran in the turn's latest delivery"],
  ["replayed", "replayed", "read back from the journal by a later delivery, not run again"],
  ["possibly-ran", "possibly ran", "a never-replay tool cut off by a worker death: not run again"],
  ["settled", "settled by its check", "a never-replay tool cut off by a worker death, whose check found its effect: its result, not run again"],
  ["failed", "failed", "interrupted: its worker died before the outcome was recorded"],
  ["waiting", "waiting", "the turn is parked on this step (a signal or a timer)"],
  ["running", "running", "running now"],
];
const LABEL = Object.fromEntries(STATES.map(([state, text]) => [state, text]));
const WAIT_TOOLS = new Set(["wait_for_signal", "sleep_until"]);

export function renderLegend(node) {
  clear(node);
  for (const [state, text, meaning] of STATES) {
    append(
      node,
      el(
        "li",
        { "data-state": state },
        el("span", { class: `swatch state-${state}`, "aria-hidden": "true" }),
        el("strong", {}, text),
        `: ${meaning}`,
      ),
    );
  }
}

/** What the page knows of one turn; `apply(event)` takes its event log, in order. */
export class TurnModel {
  constructor(turnId) {
    this.turnId = turnId;
    this.turn = null; // GET /v1/turns/{id}
    this.rows = new Map(); // seq -> StepRow from the steps route
    this.live = new Map(); // seq -> what the events say of the step
    this.deliveries = []; // {epoch, attempt, worker, at}
    this.lost = []; // {epoch, at}
    this.replays = []; // {seq, epoch, status, at}
    this.waiting = null; // {waiting_for, wake_at, at}
    this.ended = null; // turn.ended's data
    this.lastAt = null;
    this.text = null; // the latest model attempt's streamed text: {seq, attempt, text, abandoned}
  }

  apply(event) {
    const data = event.data || {};
    const at = typeof event.at === "number" ? event.at : null;
    if (at !== null) this.lastAt = Math.max(this.lastAt ?? at, at);
    switch (event.kind) {
      case "attempt.started":
        this.deliveries.push({ epoch: data.epoch, attempt: data.attempt, worker: data.worker, at });
        this.waiting = null;
        break;
      case "attempt.lost":
        this.lost.push({ epoch: data.epoch, at });
        break;
      case "step.started": {
        const prev = this.live.get(data.seq);
        this.live.set(data.seq, {
          seq: data.seq,
          kind: data.kind,
          name: data.name,
          attempts: data.attempt,
          started_at: prev?.started_at ?? at,
          finished_at: null,
          status: "intent",
        });
        break;
      }
      case "step.finished": {
        const prev = this.live.get(data.seq) || { seq: data.seq, started_at: at };
        this.live.set(data.seq, {
          ...prev,
          kind: data.kind,
          name: data.name,
          attempts: data.attempt,
          finished_at: at,
          status: data.status,
          preview: data.output,
          // The delivery in force when the outcome was recorded (as the journal's row says).
          delivery: this.deliveries.at(-1)?.attempt ?? null,
        });
        break;
      }
      case "text.delta":
        if (this.text?.seq !== data.seq || this.text?.attempt !== data.attempt) {
          this.text = { seq: data.seq, attempt: data.attempt, text: "", abandoned: false };
        }
        this.text.text += data.text ?? "";
        break;
      case "step.abandoned":
        if (this.text?.seq === data.seq && this.text?.attempt === data.attempt) this.text.abandoned = true;
        break;
      case "step.replayed":
        this.replays.push({ seq: data.seq, epoch: data.epoch, status: data.status, at });
        break;
      case "turn.waiting":
        this.waiting = { waiting_for: data.waiting_for, wake_at: data.wake_at, at };
        break;
      case "turn.ended":
        this.ended = data;
        this.waiting = null;
        break;
      default:
        break;
    }
  }

  setRows(rows) {
    this.rows = new Map(rows.map((row) => [row.seq, row]));
  }

  /** Every step, the journal's row where there is one, else what the events said. */
  steps() {
    const seqs = new Set([...this.rows.keys(), ...this.live.keys()]);
    return [...seqs].sort((a, b) => a - b).map((seq) => {
      const row = this.rows.get(seq);
      const live = this.live.get(seq);
      if (!row) return { ...live, how: this.howOf(live), source: "events" };
      // A row read before the step finished is older than the step.finished event.
      if (row.status === "intent" && live && live.status !== "intent") {
        return { ...row, ...live, how: this.howOf(live), source: "events" };
      }
      return { ...row, source: "journal" };
    });
  }

  /** The journal's `how` of a step only the events told of (see runtime/views.step_row). */
  howOf(step) {
    if (step.status === "possibly_ran") return "not re-run";
    if (step.status !== "done") return null;
    if (step.settled === "done") return "settled by its check";
    const latest = this.deliveries.at(-1)?.attempt;
    return step.delivery != null && latest != null && step.delivery !== latest ? "replayed" : "live";
  }

  turnStatus() {
    return this.ended?.status || this.turn?.status || "unknown";
  }

  stateOf(step) {
    const status = this.turnStatus();
    if (step.status === "possibly_ran" || step.how === "not re-run") return "possibly-ran";
    if (step.how === "settled by its check") return "settled";
    if (step.how === "replayed") return "replayed";
    if (step.status === "intent") {
      if (step.how === "waiting") return "waiting";
      // A wait step stays an intent until the woken turn's next delivery finishes it.
      const parked = status === "waiting" || status === "queued" || this.waiting;
      if (WAIT_TOOLS.has(step.name) && parked) return "waiting";
      if (status === "waiting") return "waiting";
      // The journal says "interrupted" when no worker holds the turn: its worker died
      // (a redelivery may still run it again).
      if (step.how === "interrupted") return "failed";
      return ["done", "failed", "cancelled"].includes(status) ? "failed" : "running";
    }
    return "live";
  }

  span() {
    const now = Date.now() / 1000;
    const starts = [this.turn?.created_at, ...this.deliveries.map((d) => d.at)];
    const ends = [this.turn?.finished_at, this.lastAt, ...this.lost.map((d) => d.at)];
    for (const step of this.steps()) {
      starts.push(step.started_at);
      ends.push(step.finished_at, step.started_at);
    }
    const unfinished = !["done", "failed", "cancelled"].includes(this.turnStatus());
    if (unfinished) ends.push(now);
    const numbers = (values) => values.filter((v) => typeof v === "number" && v > 0);
    const t0 = Math.min(...numbers(starts), now);
    const t1 = Math.max(...numbers(ends), t0 + 0.001);
    return { t0, t1, now, unfinished };
  }
}

function placeMarker(marker, at, t0, t1) {
  marker.style.left = percent(at, t0, t1);
  if ((at - t0) / (t1 - t0) > 0.65) marker.classList.add("flip");
}

function percent(t, t0, t1) {
  return `${Math.max(0, Math.min(100, ((t - t0) / (t1 - t0)) * 100)).toFixed(3)}%`;
}

function stepLabel(step) {
  return `#${step.seq} ${step.kind || "step"} ${step.name || ""}`.trim();
}

/** Draws the timeline into `node`; `onOpen(seq)` opens a step (each bar is a button). */
export function renderTimeline(node, listNode, model, onOpen) {
  const { t0, t1, now, unfinished } = model.span();
  clear(node);
  const axis = el("div", { class: "axis", "aria-hidden": "true" });
  append(
    axis,
    el("span", { class: "tick start" }, fmtTime(t0)),
    el("span", { class: "tick end" }, `${fmtTime(t1)} (${fmtSeconds(t1 - t0)})`),
  );
  const overlay = el("div", { class: "overlay" });
  model.deliveries.forEach((d) => {
    const marker = el(
      "span",
      { class: "marker delivery", title: `delivery ${d.attempt} started at ${fmtTime(d.at)}` },
      el("span", { class: "marker-label" }, `delivery ${d.attempt}`),
    );
    placeMarker(marker, d.at, t0, t1);
    overlay.append(marker);
  });
  model.lost.forEach((d) => {
    const delivery = model.deliveries.find((x) => x.epoch === d.epoch);
    const which = delivery ? `delivery ${delivery.attempt}` : `epoch ${d.epoch}`;
    const marker = el(
      "span",
      { class: "marker lost", title: `worker of ${which} lost (found at ${fmtTime(d.at)})` },
      el("span", { class: "marker-label" }, `worker lost (${which})`),
    );
    placeMarker(marker, d.at, t0, t1);
    overlay.append(marker);
  });

  const list = el("ol", { class: "steps", "aria-label": "Steps" });
  for (const step of model.steps()) {
    const state = model.stateOf(step);
    const start = step.started_at ?? t0;
    const end = step.finished_at ?? (unfinished ? now : start);
    const seconds = typeof step.duration === "number" ? step.duration : end - start;
    const attempts = step.attempts > 1 ? `, ${step.attempts} attempts` : "";
    const replayedBy = model.replays.filter((r) => r.seq === step.seq);
    const readBack = replayedBy.length ? `, read back ${replayedBy.length}×` : "";
    const label = `${stepLabel(step)}: ${LABEL[state]}, ${fmtSeconds(seconds)}${attempts}${readBack}`;
    const bar = el("span", { class: `bar state-${state}` });
    bar.style.left = percent(start, t0, t1);
    bar.style.width = `max(3px, ${percent(t0 + Math.max(0, end - start), t0, t1)})`;
    const track = el("span", { class: "track" }, bar);
    for (const replay of replayedBy) {
      const tick = el("span", { class: "replay-tick", title: `read back at ${fmtTime(replay.at)}` });
      tick.style.left = percent(replay.at, t0, t1);
      track.append(tick);
    }
    const button = el(
      "button",
      {
        type: "button",
        class: `step state-${state}`,
        "data-seq": step.seq,
        "data-state": state,
        "aria-label": label,
        title: label,
      },
      el("span", { class: "step-name" }, short(stepLabel(step), 48)),
      el("span", { class: "step-state" }, LABEL[state]),
      track,
    );
    button.addEventListener("click", () => onOpen(step.seq));
    list.append(el("li", {}, button));
  }
  append(node, axis, el("div", { class: "lanes" }, overlay, list));

  clear(listNode);
  for (const d of model.deliveries) {
    append(
      listNode,
      el("li", { class: "delivery-item" }, `Delivery ${d.attempt} started ${fmtTime(d.at)} on ${d.worker ?? "?"}`),
    );
  }
  for (const d of model.lost) {
    const delivery = model.deliveries.find((x) => x.epoch === d.epoch);
    const which = delivery ? `delivery ${delivery.attempt}` : `epoch ${d.epoch}`;
    append(listNode, el("li", { class: "lost-item" }, `Worker of ${which} died (found ${fmtTime(d.at)})`));
  }
}
