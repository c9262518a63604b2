"""The two small Node.js programs a CLI adapter puts into the container (node is in the
agent image; Python may not be). Both are written into the launch's private HOME before
the CLI starts; nothing of the harness is installed in the image.

``BRIDGE``: ``node dh-bridge.js <socket> <port> <ready-file> [<max-connections>
<read-timeout-ms>]`` listens on ``127.0.0.1:<port>`` inside the container (which has no
network but ``lo``) and relays each connection to the unix socket the worker serves its
model proxy on (the session's run folder, bind-mounted read-only). When nothing listens
there (the worker died and no new one has taken the turn yet) it keeps trying to connect,
for up to ten minutes, instead of failing the connection: the CLI's request simply waits
for the next worker. A connection that breaks in the middle (the worker died while
answering) is closed on the CLI's side too, as a dropped connection from a provider
would be. Every process in the container can connect, so it is bounded as the relay
behind it is (:mod:`.relay`): past ``max-connections`` a connection is closed at once;
one that sends nothing within the read timeout once relayed is closed; after its first
bytes the proxy's own limits hold it. (A bridge an older version started keeps no limits
for the rest of its launch.)

``HOOK``: ``node dh-hook.js <endpoint.json> <event>``, the node twin of
:mod:`.hook_client`: posts the hook's JSON to ``/_dh/<event>`` through the bridge and
prints the reply. If the connection fails before a reply arrives (the worker died), it
tries again until the deadline: every hook is idempotent on the journal (a PreToolUse
that finds its intent committed but not finished makes a ``never`` call *possibly ran*;
a PostToolUse that finds its outcome recorded does nothing). Any other failure exits 2,
which makes the CLI block the tool.

``MCP``: ``node dh-mcp.js <endpoint.json>``, the host tools as a stdio MCP server (Claude
Code's ``--mcp-config`` entry in Docker): each JSON-RPC message read on stdin is posted
to ``/mcp`` through the bridge and the proxy's answer is written back as one line. Its
point is the worker dying in the middle of a ``tools/call``: the CLI's own HTTP client
would hand the model the broken connection (``ECONNRESET``) and the step would stay an
intent; here a message whose connection fails before its whole reply arrived is posted
again, for up to ten minutes since that failure, and the bridge holds it until the next
worker serves ``/mcp``. The call is idempotent on the journal, keyed by its
``tool_use_id``: that worker answers an interrupted ``never`` tool with the *possibly
ran* notice (and records it so), runs a ``safe`` one again, and gives a recorded result
back. An HTTP error status is not retried: it becomes the message's JSON-RPC error.
"""

from __future__ import annotations

__all__ = ["BRIDGE", "HOOK", "MCP"]

BRIDGE = r"""
'use strict';
const net = require('net');
const fs = require('fs');
const [socketPath, port, readyFile, maxArg, timeoutArg] = process.argv.slice(2);
const WAIT_MS = 600000;
const MAX_CONNECTIONS = Number(maxArg) || 1024;
const READ_TIMEOUT_MS = Number(timeoutArg) || 30000;

function connectUnix(started, done) {
  const up = net.createConnection(socketPath);
  up.once('connect', () => done(null, up));
  up.once('error', (err) => {
    up.destroy();
    if (Date.now() - started > WAIT_MS) return done(err);
    setTimeout(() => connectUnix(started, done), 200);
  });
}

const server = net.createServer((client) => {
  client.pause();
  client.setNoDelay(true);
  let gone = false;
  client.on('error', () => {});
  client.on('close', () => { gone = true; });
  connectUnix(Date.now(), (err, up) => {
    if (err || gone) {
      if (up) up.destroy();
      client.destroy();
      return;
    }
    up.on('error', () => {});
    up.on('close', () => client.destroy());
    client.on('close', () => up.destroy());
    // Silent past the read timeout: closed before it reaches the proxy's limits.
    client.setTimeout(READ_TIMEOUT_MS, () => client.destroy());
    client.once('data', () => client.setTimeout(0));
    client.pipe(up);
    up.pipe(client);
    client.resume();
  });
});
server.maxConnections = MAX_CONNECTIONS;
server.on('error', (err) => {
  process.stderr.write('dh-bridge: ' + err.message + '\n');
  process.exit(3);
});
server.listen(Number(port), '127.0.0.1', () => fs.writeFileSync(readyFile, 'ready\n'));
"""

HOOK = r"""
'use strict';
const http = require('http');
const fs = require('fs');
const [endpointFile, event] = process.argv.slice(2);
const deadline = Date.now() + 600000;
const input = [];

function fail(message) {
  process.stderr.write(message + '\n');
  process.exit(2);
}

function send(body) {
  let endpoint;
  try {
    endpoint = JSON.parse(fs.readFileSync(endpointFile, 'utf8'));
  } catch (err) {
    fail('durable-harness endpoint unreadable, so this tool is blocked: ' + err.message);
  }
  let retried = false;
  const retry = (err) => {
    if (retried) return;
    retried = true;
    if (Date.now() > deadline) {
      fail('durable-harness is not reachable, so this tool is blocked: ' + err.message);
    }
    setTimeout(() => send(body), 300);
  };
  const request = http.request(new URL('/_dh/' + event, endpoint.url), {
    method: 'POST',
    agent: false,
    headers: {
      'Content-Type': 'application/json',
      'Content-Length': body.length,
      'X-Durable-Harness-Token': endpoint.token,
    },
  }, (response) => {
    const chunks = [];
    response.on('data', (chunk) => chunks.push(chunk));
    response.on('error', retry);
    response.on('aborted', () => retry(new Error('reply cut off')));
    response.on('end', () => {
      if (retried) return;
      const text = Buffer.concat(chunks).toString('utf8');
      if (response.statusCode !== 200) {
        fail('durable-harness refused this tool call: ' + text.slice(0, 500));
      }
      process.stdout.write(text, () => process.exit(0));
    });
  });
  request.on('error', retry);
  request.end(body);
}

process.stdin.on('data', (chunk) => input.push(chunk));
process.stdin.on('end', () => send(Buffer.concat(input)));
"""

MCP = r"""
'use strict';
const http = require('http');
const fs = require('fs');
const [endpointFile] = process.argv.slice(2);
const WAIT_MS = 600000;
let pending = 0;
let ended = false;
let buffered = '';

function reply(text) {
  // One message per line: the JSON is written again without the server's whitespace.
  process.stdout.write(JSON.stringify(JSON.parse(text)) + '\n');
}

function failWith(message, text) {
  if (message.id !== undefined && message.method !== undefined) {
    const error = { code: -32603, message: text };
    reply(JSON.stringify({ jsonrpc: '2.0', id: message.id, error }));
  }
}

function done() {
  pending -= 1;
  if (ended && pending === 0) process.exit(0);
}

function post(body, message, failingSince) {
  let endpoint;
  try {
    endpoint = JSON.parse(fs.readFileSync(endpointFile, 'utf8'));
  } catch (err) {
    failWith(message, 'durable-harness endpoint unreadable: ' + err.message);
    return done();
  }
  let settled = false;
  const retry = (err) => {
    if (settled) return;
    settled = true;
    const since = failingSince || Date.now();
    if (Date.now() - since > WAIT_MS) {
      failWith(message, 'durable-harness is not reachable: ' + err.message);
      return done();
    }
    setTimeout(() => post(body, message, since), 300);
  };
  const request = http.request(new URL('/mcp', endpoint.url), {
    method: 'POST',
    agent: false,
    headers: {
      'Content-Type': 'application/json',
      'Content-Length': body.length,
      'Accept': 'application/json, text/event-stream',
      'Authorization': 'Bearer ' + endpoint.token,
    },
  }, (response) => {
    const chunks = [];
    response.on('data', (chunk) => chunks.push(chunk));
    response.on('error', retry);
    response.on('aborted', () => retry(new Error('reply cut off')));
    response.on('end', () => {
      if (settled) return;
      settled = true;
      const text = Buffer.concat(chunks).toString('utf8');
      if (response.statusCode === 200 && text.trim()) {
        try {
          reply(text);
        } catch (err) {
          failWith(message, 'durable-harness answered what is not JSON: ' + text.slice(0, 500));
        }
      } else if (response.statusCode !== 200 && response.statusCode !== 202) {
        const status = response.statusCode;
        failWith(message, 'durable-harness answered ' + status + ': ' + text.slice(0, 500));
      }
      done();
    });
  });
  request.on('error', retry);
  request.end(body);
}

function handle(line) {
  if (!line.trim()) return;
  let message = {};
  try {
    const parsed = JSON.parse(line);
    if (parsed && typeof parsed === 'object') message = parsed;
  } catch (err) {
    // Posted as it is: the server answers a malformed message itself.
  }
  pending += 1;
  post(Buffer.from(line, 'utf8'), message, null);
}

process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buffered += chunk;
  let at;
  while ((at = buffered.indexOf('\n')) >= 0) {
    handle(buffered.slice(0, at));
    buffered = buffered.slice(at + 1);
  }
});
process.stdin.on('end', () => {
  handle(buffered);
  ended = true;
  if (pending === 0) process.exit(0);
});
"""
