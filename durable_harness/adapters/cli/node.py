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
"""

from __future__ import annotations

__all__ = ["BRIDGE", "HOOK"]

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
