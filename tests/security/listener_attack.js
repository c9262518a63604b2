'use strict';
// The listener attacks of test_proxy_escape.py, run by the CLI's own shell tool from
// inside the sandbox: raw bytes on every listener this process can reach (in Docker the
// launch's bridge on 127.0.0.1 and the run folder's unix socket behind it; on a host
// folder the proxy on loopback), each followed by an authenticated request that must
// still be served; then 250 idle connections held beside authenticated requests.
// module.exports(endpoint, wire, maxBody, readTimeoutMs, maxConnections) -> the results.
const net = require('net');
const fs = require('fs');

const SOCKET = '/run/durable-harness/proxy.sock';
const NON_ASCII = Buffer.from([0xff, 0xfe, 0xc3, 0xa9, 0x74, 0xc3, 0xa9]);
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

function connect(target) {
  return target.path
    ? net.createConnection({path: target.path})
    : net.createConnection({host: target.host, port: target.port});
}

function request(method, path, headers, body) {
  const parts = [Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n`)];
  for (const [name, value] of Object.entries(headers || {}))
    parts.push(Buffer.from(name + ': '), Buffer.from(value), Buffer.from('\r\n'));
  const data = Buffer.from(body || '');
  if (data.length || method === 'POST') parts.push(Buffer.from(`Content-Length: ${data.length}\r\n`));
  parts.push(Buffer.from('\r\n'), data);
  return Buffer.concat(parts);
}

// A whole answer: headers, then its Content-Length's bytes or a chunked body's end.
function whole(raw) {
  const at = raw.indexOf('\r\n\r\n');
  if (at < 0) return false;
  const length = /\r\ncontent-length:\s*(\d+)/i.exec(raw.slice(0, at));
  if (length) return raw.length - at - 4 >= Number(length[1]);
  return raw.endsWith('0\r\n\r\n');
}

// Send `data` (a byte every `perByteMs` if given), then `then` without waiting for it to
// be taken, then `pieces` one at a time as the socket takes them, stopping once an answer
// starts (a refusal mid-body is read before more is sent: sent bytes the listener never
// reads make its close a reset, which could beat the answer); the answer read until the
// listener closes, or `wait` ms.
function exchange(target, data, {perByteMs = 0, then = null, pieces = [], wait = 30000} = {}) {
  return new Promise((resolve) => {
    const started = Date.now();
    const chunks = [];
    let done = false;
    const sock = connect(target);
    const finish = (how) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const raw = Buffer.concat(chunks).toString('latin1');
      const status = /^HTTP\/1\.1 (\d{3})/.exec(raw);
      resolve({status: status ? Number(status[1]) : null, how,
               seconds: (Date.now() - started) / 1000, traceback: raw.includes('Traceback'),
               proxy: raw.includes('durable-harness'), head: raw.slice(0, 160)});
    };
    const timer = setTimeout(() => finish('no answer'), wait);
    sock.on('data', (chunk) => {
      chunks.push(chunk);
      if (whole(Buffer.concat(chunks).toString('latin1'))) finish('answered');
    });
    sock.on('error', () => finish('reset'));
    sock.on('close', () => finish('closed'));
    sock.on('connect', async () => {
      if (perByteMs) {
        for (const byte of data) {
          if (done) return;
          sock.write(Buffer.from([byte]));
          await sleep(perByteMs);
        }
      } else {
        sock.write(data);
      }
      if (then && !done) sock.write(then);
      for (const piece of pieces) {
        if (done || chunks.length) return;
        if (!sock.write(piece)) await new Promise((go) => sock.once('drain', go));
      }
    });
  });
}

module.exports = async function attack(ep, wire, maxBody, readTimeoutMs, maxConnections) {
  const url = new URL(ep.url);
  const bridge = {name: fs.existsSync(SOCKET) ? 'bridge' : 'proxy',
                  host: url.hostname, port: Number(url.port)};
  const targets = [bridge];
  if (fs.existsSync(SOCKET)) targets.push({name: 'relay-socket', path: SOCKET});
  const anthropic = wire === 'anthropic';
  const path = anthropic ? '/v1/messages' : '/v1/responses';
  const auth = (token) => anthropic ? {'x-api-key': token} : {authorization: Buffer.concat([Buffer.from('Bearer '), Buffer.from(token)])};
  // Served, and answered by the proxy itself: a path no CLI uses, with the right token
  // (refused by the proxy's policy, never sent upstream nor journaled).
  const probe = request('GET', '/v1/files', Object.assign(
    anthropic ? {'anthropic-version': '2023-06-01'} : {}, auth(ep.key)));
  const serves = async (target) => {
    const reply = await exchange(target, probe);
    return reply.status !== null && reply.status >= 400 && reply.status < 500 && reply.proxy;
  };
  const head = Buffer.from(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n`);
  const chunked = Buffer.concat([head, Buffer.from('Transfer-Encoding: chunked\r\n\r\n')]);
  const chunk = Buffer.concat([Buffer.from('4000\r\n'), Buffer.alloc(0x4000, 'x'), Buffer.from('\r\n')]);
  const many = Math.ceil(maxBody / 0x4000) + 2;
  const json = '{"model": "m", "messages": []}';
  const attacks = {
    'negative-content-length': [Buffer.concat([head, Buffer.from('Content-Length: -1\r\n\r\n{}')]), [400]],
    'minus-one-chunk': [Buffer.concat([chunked, Buffer.from('-1\r\n{}\r\n0\r\n\r\n')]), [400]],
    'non-number-content-length': [Buffer.concat([head, Buffer.from('Content-Length: 1e3\r\n\r\n')]), [400]],
    // Refused on the declared length, before any of the body is sent.
    'oversize-content-length': [Buffer.concat([head, Buffer.from(`Content-Length: ${maxBody + 1}\r\n\r\n`)]), [413]],
    // Refused half-way through the body: the bytes in flight that the listener never
    // reads make its close a reset, which can overtake its 413.
    'oversize-chunked-body': [chunked, [413, null], null, Array(many).fill(chunk)],
    'endless-chunk': [Buffer.concat([chunked, Buffer.from('fffffffffff\r\n')]), [413, null], null, Array(many).fill(Buffer.alloc(0x4000, 'x'))],
    'non-ascii-model-token': [request('POST', path, auth(NON_ASCII), json), [401]],
    'wrong-model-token': [request('POST', path, auth('sk-not-the-token'), json), [401]],
    'no-model-token': [request('POST', path, {}, json), [401]],
    'non-ascii-hook-token': [request('POST', '/_dh/PreToolUse', {'X-Durable-Harness-Token': NON_ASCII}, '{}'), [401]],
    'wrong-hook-token': [request('POST', '/_dh/PostToolUse', {'X-Durable-Harness-Token': 'not-the-token'}, '{}'), [401]],
    'non-ascii-mcp-token': [request('POST', '/mcp', {authorization: Buffer.concat([Buffer.from('Bearer '), NON_ASCII])}, '{}'), [401]],
    'wrong-mcp-token': [request('POST', '/mcp', {authorization: 'Bearer not-the-token'}, '{}'), [401]],
  };
  const out = {targets: {}, readTimeoutMs, maxConnections};
  for (const target of targets) {
    const results = [];
    // Slow clients meanwhile: headers, then a body, a byte at a time.
    const slow = [
      ['slow-headers', exchange(target, Buffer.concat([head, Buffer.from('X-Slow: ' + 'a'.repeat(40))]), {perByteMs: 500})],
      ['slow-body', exchange(target, Buffer.concat([head, Buffer.from('Content-Length: 100\r\n\r\n' + '{'.repeat(40))]), {perByteMs: 300})],
    ];
    for (const [name, [data, expected, then, pieces]] of Object.entries(attacks)) {
      const reply = await exchange(target, data, {then, pieces});
      results.push(Object.assign({name, expected, servedAfter: await serves(target)}, reply));
    }
    for (const [name, pending] of slow) {
      const reply = await pending;
      results.push(Object.assign({name, expected: [408, null], servedAfter: await serves(target)}, reply));
    }
    out.targets[target.name] = results;
  }
  // 250 idle connections to the CLI's own endpoint, half with half a request line; the
  // authenticated requests beside them must be answered, and each idle one be closed by
  // the far end within the read timeout (plus slack).
  const idle = [];
  for (let i = 0; i < 250; i++) {
    const sock = connect(bridge);
    sock.closedAt = null;
    sock.on('error', () => {});
    sock.answer = '';
    sock.on('data', (chunk) => { sock.answer += chunk.toString('latin1'); });  // reads to EOF
    sock.on('close', () => { sock.closedAt = Date.now(); });
    if (i % 2) sock.write('POST / HTTP/1.1\r\n');
    idle.push(sock);
  }
  await sleep(300);
  const started = Date.now();
  let served = 0;
  for (let i = 0; i < 10; i++) if (await serves(bridge)) served++;
  const probeSeconds = (Date.now() - started) / 1000;
  const openDuringProbes = idle.filter((s) => s.closedAt === null).length;
  // 60 more, to the bridge, past its cap: those over it are closed at once.
  let overCap = null;
  if (bridge.name === 'bridge') {
    const extra = [];
    for (let i = 0; i < 60; i++) {
      const sock = connect(bridge);
      sock.closedAt = null;
      sock.on('error', () => {});
      sock.on('data', () => {});
      sock.on('close', () => { sock.closedAt = Date.now(); });
      extra.push(sock);
    }
    await sleep(500);
    overCap = extra.filter((s) => s.closedAt !== null).length;
    for (const sock of extra) sock.destroy();
  }
  await sleep(readTimeoutMs + 4000);
  const closedByFarEnd = idle.filter((s) => s.closedAt !== null).length;
  const answered408 = idle.filter((s) => s.answer.startsWith('HTTP/1.1 408')).length;
  for (const sock of idle) sock.destroy();
  out.idle = {held: idle.length, openDuringProbes, probes: 10, served, probeSeconds,
              overCap, closedByFarEnd, answered408, servedAfter: await serves(bridge)};
  return out;
};
