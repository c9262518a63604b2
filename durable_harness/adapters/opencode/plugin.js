// durable-harness's OpenCode plugin: journals every tool call through the harness.
//
// Installed by the opencode adapter into the private config folder of one launch
// (~/.config/opencode/plugin/). $DURABLE_HARNESS_ENDPOINT names a JSON file
// {"url", "token"}: the journaling proxy of this launch and its per-launch token.
//
// tool.execute.before posts the call (Claude Code's PreToolUse shape: tool_name,
// tool_input, tool_use_id = OpenCode's callID) to <url>/_dh/PreToolUse and lets the tool
// run only when the harness answers "allow". Throwing blocks the tool (the model gets the
// message as the tool's error), so a harness that denies, fails or cannot be reached
// blocks it: a tool never runs without its intent recorded first (fail closed).
// tool.execute.after posts the result to <url>/_dh/PostToolUse.
// In the Docker sandbox the endpoint file also says "retry": true: the CLI outlives its
// worker, so a post whose connection failed (the worker died) is sent again until a new
// worker answers (every hook is idempotent on the journal), for up to ten minutes.
// The bash tool's timeout (milliseconds; OpenCode's default is 2 minutes, with no upper
// bound on what the model asks) is held to the operator's ceiling,
// DURABLE_HARNESS_MAX_TOOL_TIMEOUT (seconds) in the CLI's environment, read once at load:
// the endpoint file is in a HOME that code in the sandbox can rewrite, the CLI's
// environment it cannot. The hooks post the model's own arguments, not the capped copy.
// The plugin announces itself with SessionStart when OpenCode loads it: the harness
// refuses to answer a model call before that, as proof the journaling is live.
import { readFileSync } from "node:fs";

function endpoint() {
  const file = process.env.DURABLE_HARNESS_ENDPOINT;
  if (!file) throw new Error("durable-harness: DURABLE_HARNESS_ENDPOINT is not set");
  return JSON.parse(readFileSync(file, "utf8"));
}

async function post(event, payload) {
  const { url, token, retry } = endpoint();
  const deadline = Date.now() + 600000;
  let response;
  let text;
  for (;;) {
    try {
      response = await fetch(`${url}/_dh/${event}`, {
        method: "POST",
        headers: { "content-type": "application/json", "X-Durable-Harness-Token": token },
        body: JSON.stringify(payload),
      });
      text = await response.text();
      break;
    } catch (error) {
      if (!retry || Date.now() > deadline) {
        throw new Error(`durable-harness cannot be reached (${error}); the tool was blocked`);
      }
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }
  if (!response.ok) {
    throw new Error(`durable-harness refused the call (HTTP ${response.status}: ${text})`);
  }
  return text ? JSON.parse(text) : {};
}

const ceilingS = Number(process.env.DURABLE_HARNESS_MAX_TOOL_TIMEOUT);
const CEILING_MS = Number.isFinite(ceilingS) && ceilingS > 0 ? Math.max(Math.floor(ceilingS * 1000), 1) : undefined;
const DEFAULT_TIMEOUT_MS = 120000; // OpenCode's own, for a call that names none

export const DurableHarness = async ({ directory }) => {
  const asked = new Map(); // callID -> the model's own arguments, for PostToolUse
  await post("SessionStart", { hook_event_name: "SessionStart", cwd: directory });
  return {
    "tool.execute.before": async (input, output) => {
      const reply = await post("PreToolUse", {
        hook_event_name: "PreToolUse",
        session_id: input.sessionID,
        tool_name: input.tool,
        tool_input: output.args ?? {},
        tool_use_id: input.callID,
        cwd: directory,
      });
      const decision = reply?.hookSpecificOutput ?? {};
      if (decision.permissionDecision !== "allow") {
        throw new Error(decision.permissionDecisionReason || "durable-harness denied this call");
      }
      const args = output.args;
      if (input.tool === "bash" && CEILING_MS !== undefined && args) {
        asked.set(input.callID, JSON.parse(JSON.stringify(args)));
        const timeout = Number(args.timeout ?? DEFAULT_TIMEOUT_MS);
        if (!(timeout > 0 && timeout <= CEILING_MS)) args.timeout = CEILING_MS;
      }
    },
    "tool.execute.after": async (input, output) => {
      await post("PostToolUse", {
        hook_event_name: "PostToolUse",
        session_id: input.sessionID,
        tool_name: input.tool,
        tool_input: asked.get(input.callID) ?? input.args ?? {},
        tool_use_id: input.callID,
        tool_response: { title: output.title, output: output.output, metadata: output.metadata },
      });
    },
  };
};
