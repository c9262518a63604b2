// Attacks on an ACP launch's unix socket (acp-<random>.sock in the session's run folder),
// run inside the session's container as the agent user, as anything the agent left
// running there would: it waits for the socket to appear (the worker listens before the
// launch's job starts) and at once connects with no token (an empty line), a wrong token,
// an earlier launch's token (read from that launch's HOME), an oversized first line and a
// slow sender (half a line, then nothing); once the socket is gone (taken by the launch)
// it tries a second connection. Prints one JSON line: per attack, whether the worker sent
// anything and whether it closed the connection.
const fs = require("fs"), net = require("net");
const [runDir, oldToken, deadlineS] = process.argv.slice(2);
const deadline = Date.now() + 1000 * Number(deadlineS);
const results = {};

function socketPath() {
  try {
    const name = fs.readdirSync(runDir).find((n) => /^acp-[0-9a-f]+\.sock$/.test(n));
    return name ? `${runDir}/${name}` : null;
  } catch (e) {
    return null;
  }
}

function attack(name, path, payload) {
  return new Promise((resolve) => {
    const r = { connected: false, received: 0, closed: false, timedOut: false, error: null };
    results[name] = r;
    const conn = net.connect(path);
    conn.on("connect", () => { r.connected = true; if (payload) conn.write(payload); });
    conn.on("data", (d) => { r.received += d.length; });
    conn.on("error", (e) => { r.error = e.code || e.message; });
    conn.on("close", () => { r.closed = true; resolve(); });
    // Longer than the listener's read timeout the test sets: the slow one must be cut.
    setTimeout(() => { r.timedOut = !r.closed; conn.destroy(); resolve(); }, 20000);
  });
}

async function main() {
  let path = null;
  while (!(path = socketPath())) {
    if (Date.now() > deadline) throw new Error("no acp-*.sock appeared");
    await new Promise((r) => setImmediate(r));
  }
  const first = Promise.all([
    attack("no token", path, "\n"),
    attack("wrong token", path, "x".repeat(43) + "\n"),
    attack("earlier launch's token", path, oldToken + "\n"),
    attack("oversized first line", path, "A".repeat(100000) + "\n"),
    attack("slow sender", path, "ab"),
  ]);
  while (fs.existsSync(path) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
  await attack("second connection", path, "anything\n");
  await first;
  console.log("ATTACKS " + JSON.stringify(results));
}

main().catch((e) => { console.log("ATTACK-ERROR " + e.message); process.exit(1); });
