// The durable-harness extension for Pi (loaded with `pi -e extension.js`).
//
// It journals every tool call through the harness's journaling proxy, the way Claude
// Code's PreToolUse/PostToolUse hook commands do (adapters/hooks.py ToolHooks):
//
// * tool_call: POST /_dh/PreToolUse {tool_name, tool_input, tool_use_id}; the tool runs
//   only on "allow". A "deny", an error, or a harness that cannot be reached blocks the
//   tool (fail closed: a tool never runs before its intent is recorded).
// * tool_result: POST /_dh/PostToolUse with the result; when the harness answers with the
//   journal's result (the call was recorded before), that result replaces Pi's.
// * session_start: POST /_dh/SessionStart, the proof the harness waits for before it
//   answers the first model call.
// * the user's host tools and the wait tools (listed in the endpoint file) are registered
//   as Pi tools whose execute() calls the harness's MCP endpoint: the harness runs and
//   journals them. Their tool_call posts PreToolUse too, the name prefixed with
//   hostToolPrefix: the harness saves the session file first, and a wait still pending
//   stops this CLI there (the harness's wait gate, stop mode).
//
// In the Docker sandbox the endpoint file also says {retry: true}: the CLI outlives its
// worker, so a request whose connection failed (the worker died) is sent again until a
// new worker answers (every hook is idempotent on the journal), for up to ten minutes.
//
// * the bash tool's timeout (seconds; Pi has no default: a command would run for ever) is
//   held to the operator's ceiling, DURABLE_HARNESS_MAX_TOOL_TIMEOUT in the CLI's
//   environment, read once at load (the endpoint file is in a HOME that code in the
//   sandbox can rewrite; the CLI's environment it cannot). The journal keeps the model's
//   own input: the hooks post it, not the capped copy Pi runs.
//
// The endpoint file ({url, token, hostTools, hostToolPrefix, retry}) lives in the
// launch's private HOME; its path comes in DURABLE_HARNESS_PI_ENDPOINT. Plain JavaScript
// (Pi loads it with jiti), no imports beyond Node's own.
import { readFileSync } from "node:fs";

const ENDPOINT_ENV = "DURABLE_HARNESS_PI_ENDPOINT";

function loadEndpoint() {
  const path = process.env[ENDPOINT_ENV];
  if (!path) {
    throw new Error(`durable-harness: ${ENDPOINT_ENV} is not set`);
  }
  return JSON.parse(readFileSync(path, "utf8"));
}

const RETRY_MS = 600000;

// fetch, sent again after a failed connection while the endpoint asks for retries.
async function send(endpoint, url, init) {
  const deadline = Date.now() + RETRY_MS;
  for (;;) {
    try {
      const response = await fetch(url, init);
      return { status: response.status, text: await response.text() };
    } catch (error) {
      if (!endpoint.retry || Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }
}

const CEILING_ENV = "DURABLE_HARNESS_MAX_TOOL_TIMEOUT";

// The ceiling in seconds, or undefined when the harness set none.
function loadCeiling() {
  const value = Number(process.env[CEILING_ENV]);
  return Number.isFinite(value) && value > 0 ? value : undefined;
}

export default function durableHarness(pi) {
  const endpoint = loadEndpoint();
  const ceiling = loadCeiling();
  const asked = new Map(); // toolCallId -> the model's own input, for PostToolUse
  const hostTools = new Set((endpoint.hostTools || []).map((t) => t.name));

  async function post(event, payload) {
    const response = await send(endpoint, `${endpoint.url}/_dh/${event}`, {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        "X-Durable-Harness-Token": endpoint.token,
      },
      body: JSON.stringify(payload),
    });
    const text = response.text;
    if (response.status !== 200) {
      throw new Error(`durable-harness refused ${event} (HTTP ${response.status}): ${text.slice(0, 500)}`);
    }
    return text ? JSON.parse(text) : {};
  }

  pi.on("session_start", async () => {
    await post("SessionStart", {});
  });

  pi.on("tool_call", async (event) => {
    // A host tool is journaled by the harness's MCP handler when it runs; its PreToolUse
    // (under the prefixed name) only saves the session and gates the wait tools.
    const host = hostTools.has(event.toolName);
    let reply;
    try {
      reply = await post("PreToolUse", {
        hook_event_name: "PreToolUse",
        tool_name: host ? `${endpoint.hostToolPrefix || ""}${event.toolName}` : event.toolName,
        tool_input: event.input,
        tool_use_id: event.toolCallId,
      });
    } catch (error) {
      return {
        block: true,
        reason: `durable-harness is not reachable, so this tool is blocked: ${error}`,
      };
    }
    const decision = (reply && reply.hookSpecificOutput) || {};
    if (decision.permissionDecision === "allow") {
      if (event.toolName === "bash" && ceiling !== undefined && event.input) {
        asked.set(event.toolCallId, JSON.parse(JSON.stringify(event.input)));
        const timeout = Number(event.input.timeout);
        if (!(timeout > 0 && timeout <= ceiling)) event.input.timeout = ceiling;
      }
      return undefined;
    }
    return {
      block: true,
      reason: decision.permissionDecisionReason || "durable-harness did not allow this call",
    };
  });

  pi.on("tool_result", async (event) => {
    if (hostTools.has(event.toolName)) {
      return undefined;
    }
    let reply;
    try {
      reply = await post("PostToolUse", {
        hook_event_name: "PostToolUse",
        tool_name: event.toolName,
        tool_input: asked.get(event.toolCallId) ?? event.input,
        tool_use_id: event.toolCallId,
        tool_response: { content: event.content, isError: Boolean(event.isError) },
      });
    } catch {
      // The harness is gone: the call's outcome stays unrecorded (the journal still has
      // its intent), and this launch is about to be stopped; keep Pi's own result.
      return undefined;
    }
    if (reply && reply.replace) {
      return { content: reply.replace.content, isError: Boolean(reply.replace.isError) };
    }
    return undefined;
  });

  for (const tool of endpoint.hostTools || []) {
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description || tool.name,
      parameters: tool.inputSchema || { type: "object", properties: {} },
      async execute(toolCallId, params) {
        const response = await send(endpoint, `${endpoint.url}/mcp`, {
          method: "POST",
          headers: {
            "Content-Type": "application/json",
            Authorization: `Bearer ${endpoint.token}`,
          },
          body: JSON.stringify({
            jsonrpc: "2.0",
            id: 1,
            method: "tools/call",
            params: {
              name: tool.name,
              arguments: params,
              _meta: { "claudecode/toolUseId": toolCallId },
            },
          }),
        });
        if (response.status !== 200) {
          throw new Error(`durable-harness host tool ${tool.name}: HTTP ${response.status}`);
        }
        const result = JSON.parse(response.text).result || {};
        const content = result.content || [];
        if (result.isError) {
          // Pi marks a result as an error only when execute() throws.
          throw new Error(content.map((c) => c.text || "").join("\n"));
        }
        return { content, details: {} };
      },
    });
  }
}
