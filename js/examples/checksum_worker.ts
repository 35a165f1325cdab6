// Processes `sha256-file` jobs: reads each file, computes its SHA-256 and appends
// `<hex digest>  <path>` to an output file (the `sha256sum` format). Stops on SIGTERM or
// Ctrl-C, or with `--exit-when-idle` once the queue has been empty for two seconds. The Node
// twin of core/examples/checksum_worker.rs.
//
//   node checksum_worker.js [--out checksums.txt] [--server URL] [--queue checksums] [--concurrency 16] [--exit-when-idle]

import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { open, stat } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { HandlerError, SeppClient, Worker } from "sepp";

const { values: flags } = parseArgs({
  options: {
    out: { type: "string", default: "checksums.txt" },
    server: { type: "string", default: "http://127.0.0.1:50051" },
    queue: { type: "string", default: "checksums" },
    concurrency: { type: "string", default: "16" },
    "exit-when-idle": { type: "boolean", default: false },
  },
});

/** The SHA-256 of the file at `path`, in hex; stops reading when `signal` aborts. */
async function sha256File(path: string, signal: AbortSignal): Promise<string> {
  const hash = createHash("sha256");
  await pipeline(createReadStream(path), hash, { signal });
  return hash.digest("hex");
}

/**
 * Resolves once `queue` has had no ready, scheduled or leased job for `quietMs` milliseconds,
 * or when `signal` aborts.
 */
async function idle(client: SeppClient, queue: string, quietMs: number, signal: AbortSignal): Promise<void> {
  let idleSince: number | undefined;
  while (!signal.aborted) {
    await sleep(250, undefined, { signal }).catch(() => {});
    const stats = await client.getQueueStats(queue).catch(() => undefined);
    const empty = stats !== undefined && stats.ready + stats.scheduled + stats.inFlight === 0;
    if (!empty) idleSince = undefined;
    else if (idleSince === undefined) idleSince = performance.now();
    else if (performance.now() - idleSince >= quietMs) return;
  }
}

const client = await SeppClient.connect(flags.server);
// Lines are appended with one write each (O_APPEND), so concurrent handlers never interleave.
const out = await open(flags.out, "a");
let bytes = 0;

const worker = new Worker(client, {
  queues: [flags.queue],
  maxInFlight: Math.max(1, Number.parseInt(flags.concurrency, 10) || 16),
  waitTimeoutMs: 1_000,
});
worker.handle("sha256-file", async (job, { signal }) => {
  if (job.payload === undefined) throw HandlerError.permanent("no path in payload");
  const path = Buffer.from(job.payload.data).toString("utf8");
  let hex: string;
  try {
    hex = await sha256File(path, signal);
    // Not `bytes += (await ...)`: that reads `bytes` before the await and loses updates.
    const { size } = await stat(path);
    bytes += size;
  } catch (err) {
    // Lease lost or shutting down: let the worker report it (the job is delivered again).
    if (signal.aborted) throw err;
    // A file that vanished or cannot be read will not get better.
    throw HandlerError.permanent(`${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
  await out.write(`${hex}  ${path}\n`);
});

const t0 = performance.now();
const stopWatching = new AbortController();
if (flags["exit-when-idle"]) {
  void idle(client, flags.queue, 2_000, stopWatching.signal).then(() => worker.stop());
}
const report = await worker.run();
stopWatching.abort();
await out.close();
client.close();

const secs = (performance.now() - t0) / 1000;
console.log(
  `${report.acked} files hashed (${report.nacked} failed) in ${secs.toFixed(1)} s: ` +
    `${(report.acked / secs).toFixed(0)} files/s, ${(bytes / (1024 * 1024)).toFixed(1)} MiB hashed; results in ${flags.out}`,
);
