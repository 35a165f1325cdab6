// A process that leaves a client open still exits on its own: the client holds no handle
// that keeps Node's event loop alive once no call is in flight.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { startServer } from "../test-support/server.js";

const child = fileURLToPath(new URL("../test-support/exit-child.js", import.meta.url));

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;

before(async () => {
  server = await startServer();
});

after(() => server?.stop());

test("a process with an open client exits cleanly when its work is done", { timeout: 30_000 }, async () => {
  const started = Date.now();
  const { stdout, stderr } = await promisify(execFile)(process.execPath, [child, server.url], {
    timeout: 20_000,
  });
  const ack = JSON.parse(stdout);
  assert.equal(ack.deduplicated, false);
  assert.equal(stderr, "");
  assert.ok(Date.now() - started < 20_000);
});
