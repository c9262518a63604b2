// The page's only way to the server: /v1 with `Authorization: Bearer <token>`.
// The token lives in this tab's sessionStorage, never in a URL, a cookie or the DOM.

const TOKEN_KEY = "durable-harness.token";
// The API sits beside /ui/ (this file is served at <root>/ui/assets/api.js), so a
// reverse proxy's path prefix carries over.
const ROOT = new URL("../../", import.meta.url);

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** The URL of an API path with its query (values encoded; empty ones left out). */
export function apiUrl(path, params = {}) {
  const url = new URL(`v1/${path}`, ROOT);
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  return url;
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${getToken()}`, ...extra };
}

async function failure(response) {
  if (response.status === 401) return new Unauthorized("the token was refused");
  let code = "";
  let message = "";
  try {
    const body = await response.json();
    code = body?.error?.code || "";
    message = body?.error?.message || "";
  } catch {
    // Not the API's JSON (a proxy's page, the listener's plain 503): the status says enough.
  }
  return new ApiError(response.status, code, message);
}

export async function getJson(path, params = {}, signal = undefined) {
  const response = await fetch(apiUrl(path, params), {
    headers: headers(),
    cache: "no-store",
    credentials: "omit",
    signal,
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJson(path, body) {
  const response = await fetch(apiUrl(path), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

/** Feeds SSE text to `onEvent({id, event, data})`; a tiny parser of the standard's
 * framing: `field: value` lines, `:` comments, a blank line ends an event. */
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.id = null;
    this.event = "message";
    this.data = [];
  }

  push(text) {
    this.buffer += text;
    // A CR at the end may be the first half of a CRLF split across two reads: keep it.
    const end = this.buffer.endsWith("\r") ? this.buffer.length - 1 : this.buffer.length;
    const lines = this.buffer.slice(0, end).split(/\r\n|\r|\n/);
    this.buffer = lines.pop() + this.buffer.slice(end);
    for (const line of lines) this.line(line);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) this.onEvent({ id: this.id, event: this.event, data: this.data.join("\n") });
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") this.id = value;
    else if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
  }
}

/**
 * Follows a turn's event stream until `turn.ended` or `stop()`. EventSource cannot send
 * an Authorization header, so this reads the stream with fetch() and reconnects after a
 * drop (the server also ends a stream after its maximum age) with `Last-Event-ID`, so
 * each event arrives once. `onEvent(event)` gets the parsed `{seq, kind, data, at}`.
 */
export function followEvents(turnId, { onEvent, onState, onUnauthorized }) {
  const controller = new AbortController();
  let lastId = 0;
  let ended = false;
  let backoff = 250;

  async function once() {
    const response = await fetch(apiUrl(`turns/${encodeURIComponent(turnId)}/events`), {
      headers: headers(lastId ? { "Last-Event-ID": String(lastId) } : {}),
      cache: "no-store",
      credentials: "omit",
      signal: controller.signal,
    });
    if (response.status === 204) {
      ended = true; // already past turn.ended
      return;
    }
    if (!response.ok) throw await failure(response);
    onState("live");
    const parser = new SseParser((raw) => {
      let event;
      try {
        event = JSON.parse(raw.data);
      } catch {
        return;
      }
      const seq = Number(raw.id ?? event.seq);
      if (!(seq > lastId)) return; // never twice
      lastId = seq;
      backoff = 250;
      if (event.kind === "turn.ended") ended = true;
      onEvent(event);
    });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(value);
    }
    parser.push("\n\n"); // a last event without its blank line
  }

  (async () => {
    while (!ended && !controller.signal.aborted) {
      try {
        await once();
      } catch (error) {
        if (controller.signal.aborted) return;
        if (error instanceof Unauthorized) {
          onUnauthorized();
          return;
        }
        if (error instanceof ApiError && error.status >= 400 && error.status < 500 &&
            error.status !== 408 && error.status !== 429) {
          onState(`stream refused: ${error.message}`);
          return;
        }
      }
      if (ended || controller.signal.aborted) break;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, 5000);
    }
    if (ended) onState("ended");
  })();

  return { stop: () => controller.abort(), lastId: () => lastId };
}
