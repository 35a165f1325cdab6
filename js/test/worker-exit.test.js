// A process running a Worker: SIGTERM stops it gracefully (the running handler finishes, the
// process exits 0), and a stopped worker with its client still open keeps no handle that
// would stop Node from exiting.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { SeppClient } from "sepp";
import { startServer } from "../test-support/server.js";

const childScript = fileURLToPath(new URL("../test-support/worker-child.js", import.meta.url));

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {SeppClient} */
let client;

before(async () => {
  server = await startServer();
  client = await SeppClient.connect(server.url);
});

after(async () => {
  client?.close();
  await server?.stop();
});

/**
 * Starts the child on `queue` in `mode`; `lines` yields its stdout lines, `exited` its exit.
 * It is killed if still alive after 20 s, which fails the test through its exit status.
 */
function startChild(queue, mode) {
  const child = spawn(process.execPath, [childScript, server.url, queue, mode], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const killer = setTimeout(() => child.kill("SIGKILL"), 20_000);
  const exited = once(child, "exit").then(([code, signal]) => {
    clearTimeout(killer);
    return { code, signal, stderr };
  });
  const lines = createInterface({ input: child.stdout });
  /** @type {string[]} */
  const seen = [];
  lines.on("line", (line) => seen.push(line));
  /** Resolves with the first line starting with `prefix`. */
  const line = (prefix) =>
    new Promise((resolve, reject) => {
      const found = seen.find((l) => l.startsWith(prefix));
      if (found !== undefined) return resolve(found);
      const onLine = (/** @type {string} */ l) => {
        if (l.startsWith(prefix)) {
          lines.off("line", onLine);
          resolve(l);
        }
      };
      lines.on("line", onLine);
      void exited.then(({ code, signal, stderr: err }) =>
        reject(new Error(`child exited (${code ?? signal}) before printing ${prefix}:\n${err}`)),
      );
    });
  return { child, exited, line, seen };
}

test("SIGTERM stops a worker process gracefully: the running handler finishes, exit code 0", { timeout: 30_000 }, async () => {
  const queue = "sigterm";
  const { jobId } = await client.enqueue({ queue, jobType: "t" });
  const { child, exited, line, seen } = startChild(queue, "signal");
  assert.equal(await line("started"), `started ${jobId}`);
  child.kill("SIGTERM");
  const { code, signal, stderr } = await exited;
  // The one line the stop prints while its handler runs on.
  assert.deepEqual(
    { code, signal, stderr },
    {
      code: 0,
      signal: null,
      stderr:
        "sepp worker stopping: waiting up to 30 s (shutdown_timeout) for 1 running job to finish; if not done by then, it is given back to the queue (nacked, counting the attempt)\n",
    },
  );
  assert.ok(seen.includes(`finished ${jobId}`), seen.join("\n"));
  const report = JSON.parse((await line("report")).slice("report ".length));
  assert.deepEqual(report, { acked: 1, nacked: 0, leaseLost: 0, abandoned: 0 });
  assert.ok(["acked", "unknown"].includes((await client.getJob(jobId)).state));
});

test("a process with an open client and a stopped worker exits on its own", { timeout: 30_000 }, async () => {
  const queue = "stopped";
  const { jobId } = await client.enqueue({ queue, jobType: "t" });
  const started = Date.now();
  const { exited, line } = startChild(queue, "stop");
  const { code, signal, stderr } = await exited;
  assert.deepEqual({ code, signal, stderr }, { code: 0, signal: null, stderr: "" });
  assert.ok(Date.now() - started < 15_000, "exited promptly");
  assert.equal(await line("finished"), `finished ${jobId}`);
  const report = JSON.parse((await line("report")).slice("report ".length));
  assert.equal(report.acked, 1);
});
