// Enqueue throughput and latency from one Node process: the `sepp` package (the Rust core under
// napi-rs) against a plain `@grpc/grpc-js` client of the same protocol, loading
// proto/sepp/v1/queue.proto at run time with `@grpc/proto-loader`. See README.md.
//
//   node bench.mjs [--mode sync_all,buffer] [--clients sepp,grpc-js] [--concurrency 50]
//                  [--duration 10] [--warmup 1] [--payload-bytes 256] [--rounds 1]
//                  [--server-bin PATH | --target HOST:PORT] [--json]
//
// For each persist mode it starts a fresh release server (listen_addr port 0, a new data
// directory, that persist_mode, every other setting the server's default), then measures each
// client in turn: `concurrency` loops in this one process, each with one enqueue in flight at a
// time (so 50 concurrent promises), every enqueue a new job with a fresh idempotency key and a
// `payload-bytes` payload, on a queue of its own. Each client has one HTTP/2 connection.

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs, promisify } from "node:util";
import { SeppClient } from "sepp";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

const { values: flags } = parseArgs({
  options: {
    mode: { type: "string", default: "sync_all,buffer" },
    clients: { type: "string", default: "sepp,grpc-js" },
    concurrency: { type: "string", default: "50" },
    duration: { type: "string", default: "10" },
    warmup: { type: "string", default: "1" },
    "payload-bytes": { type: "string", default: "256" },
    rounds: { type: "string", default: "1" },
    "server-bin": { type: "string" },
    target: { type: "string" },
    json: { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  },
});
if (flags.help) {
  console.log(
    "usage: node bench.mjs [--mode sync_all,buffer] [--clients sepp,grpc-js] [--concurrency 50]\n" +
      "                      [--duration SECONDS] [--warmup SECONDS] [--payload-bytes 256]\n" +
      "                      [--rounds N] (each mode measures every client N times, alternating)\n" +
      "                      [--server-bin PATH | --target HOST:PORT] [--json]",
  );
  process.exit(0);
}

const concurrency = positiveInt(flags.concurrency, "--concurrency");
const durationMs = Number(flags.duration) * 1000;
const warmupMs = Number(flags.warmup) * 1000;
const payload = randomBytes(positiveInt(flags["payload-bytes"], "--payload-bytes"));
const rounds = positiveInt(flags.rounds, "--rounds");
const runId = Date.now().toString(36);

function positiveInt(text, name) {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${text}`);
  return n;
}

/** The release server: --server-bin, else $CARGO_TARGET_DIR/release/sepp, else target/release/sepp. */
function serverBin() {
  if (flags["server-bin"]) return resolve(flags["server-bin"]);
  const target = process.env.CARGO_TARGET_DIR ? resolve(repo, process.env.CARGO_TARGET_DIR) : join(repo, "target");
  return join(target, "release", "sepp");
}

/**
 * Starts a server with `persist_mode = mode` on a fresh data directory; resolves to its
 * address and a stop function (SIGTERM, then removes the directory).
 */
async function startServer(mode) {
  const dir = await mkdtemp(join(tmpdir(), "sepp-bench-node-"));
  const config = join(dir, "sepp.toml");
  await writeFile(
    config,
    [
      "[server]",
      'listen_addr = "127.0.0.1:0"',
      `db_path = ${JSON.stringify(join(dir, "data"))}`,
      "",
      "[storage]",
      `persist_mode = ${JSON.stringify(mode)}`,
      "",
    ].join("\n"),
  );
  // Only SEPP_LOG passes: other SEPP_* variables would override the config under test.
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("SEPP_") || k === "SEPP_LOG"),
  );
  env.SEPP_LOG ??= "warn";
  const bin = serverBin();
  const child = spawn(bin, ["--config", config], { env, stdio: ["ignore", "pipe", "inherit"] });
  const exited = once(child, "exit");
  const failed = Promise.race([
    once(child, "error").then(([e]) => {
      throw new Error(`cannot start ${bin}: ${e.message} (build it: cargo build --release --bin sepp)`);
    }),
    exited.then(([code, signal]) => {
      throw new Error(`${bin} exited (${code ?? signal}) before listening`);
    }),
  ]);
  const lines = createInterface({ input: child.stdout });
  const [line] = await Promise.race([once(lines, "line"), failed]);
  const match = /^sepp listening on (\S+)$/.exec(line);
  if (!match) throw new Error(`unexpected first line from ${bin}: ${JSON.stringify(line)}`);
  child.stdout.resume();
  return {
    addr: match[1],
    async stop() {
      child.kill("SIGTERM");
      await exited;
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** The sepp package: one `SeppClient`; `enqueue` is one EnqueueBatch call of one job. */
async function seppClient(addr) {
  const client = await SeppClient.connect(`http://${addr}`);
  return {
    enqueue: (queue, key) =>
      client.enqueue({
        queue,
        jobType: "bench",
        payload: { data: payload, encoding: "application/octet-stream" },
        idempotencyKey: key,
      }),
    close: () => client.close(),
  };
}

/** A plain @grpc/grpc-js client of sepp.v1.QueueService, the proto loaded at run time. */
async function grpcJsClient(addr) {
  const definition = protoLoader.loadSync(join(repo, "proto", "sepp", "v1", "queue.proto"), {
    includeDirs: [join(repo, "proto")],
    keepCase: false,
    longs: String,
    enums: String,
    defaults: false,
    oneofs: true,
  });
  const { sepp } = /** @type {any} */ (grpc.loadPackageDefinition(definition));
  const stub = new sepp.v1.QueueService(addr, grpc.credentials.createInsecure());
  await promisify(stub.waitForReady.bind(stub))(Date.now() + 10_000);
  const enqueueBatch = promisify(stub.enqueueBatch.bind(stub));
  return {
    async enqueue(queue, key) {
      const response = await enqueueBatch({
        jobs: [
          {
            queue,
            jobType: "bench",
            payload: { data: payload, encoding: "application/octet-stream" },
            idempotencyKey: key,
          },
        ],
      });
      const result = response.results[0];
      if (result?.success === undefined || result.success === null) {
        throw new Error(`enqueue rejected: ${JSON.stringify(result?.rejection)}`);
      }
      return result.success;
    },
    close: () => stub.close(),
  };
}

const CLIENTS = { sepp: seppClient, "grpc-js": grpcJsClient };

/** The `q`-quantile of sorted `values` (nearest rank). */
function quantile(sorted, q) {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

/**
 * Runs `concurrency` enqueue loops for the warm-up, then for the measured window. A call
 * counts when it starts and ends inside the window; its latency is taken from
 * `performance.now()` around the awaited call.
 */
async function measure(client, queue) {
  const start = performance.now();
  const windowStart = start + warmupMs;
  const windowEnd = windowStart + durationMs;
  const latencies = [];
  let errors = 0;
  let firstError;
  let seq = 0;
  let cpuAtStart;
  const cpuTimer = setTimeout(() => {
    cpuAtStart = process.cpuUsage();
  }, warmupMs);
  const loop = async (id) => {
    for (;;) {
      const t0 = performance.now();
      if (t0 >= windowEnd) return;
      try {
        await client.enqueue(queue, `${runId}-${id}-${seq++}`);
      } catch (e) {
        errors += 1;
        firstError ??= e;
        continue;
      }
      const t1 = performance.now();
      if (t0 >= windowStart && t1 <= windowEnd) latencies.push(t1 - t0);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, (_, i) => loop(i)));
  clearTimeout(cpuTimer);
  const cpu = process.cpuUsage(cpuAtStart);
  latencies.sort((a, b) => a - b);
  return {
    enqueuesPerSec: latencies.length / (durationMs / 1000),
    p50Ms: quantile(latencies, 0.5),
    p99Ms: quantile(latencies, 0.99),
    calls: latencies.length,
    errors,
    firstError: firstError === undefined ? undefined : String(firstError),
    // CPU time of this whole process (JavaScript thread, libuv and the addon's tokio threads)
    // over the window, as a share of one core.
    clientCpuPct: ((cpu.user + cpu.system) / 1000 / durationMs) * 100,
  };
}

const modes = flags.target ? ["target"] : flags.mode.split(",");
const clientNames = flags.clients.split(",");
for (const name of clientNames) if (!(name in CLIENTS)) throw new Error(`unknown client ${name}`);

const results = [];
for (const mode of modes) {
  const server = flags.target ? { addr: flags.target, stop: async () => {} } : await startServer(mode);
  try {
    // Round r measures the clients in the given order when r is even, reversed when odd, so
    // that a drift of the machine weighs on every client alike.
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 === 0 ? clientNames : [...clientNames].reverse();
      for (const name of order) {
        const client = await CLIENTS[name](server.addr);
        try {
          const queue = `bench-node-${runId}-${mode}-${name}-${round}`;
          const r = await measure(client, queue);
          results.push({ mode, client: name, round: round + 1, ...r, loadAverage: loadavg()[0] });
          if (!flags.json) {
            console.error(
              `${mode.padEnd(8)} ${name.padEnd(8)} ${r.enqueuesPerSec.toFixed(0).padStart(7)} enqueues/s  ` +
                `p50 ${r.p50Ms.toFixed(2)} ms  p99 ${r.p99Ms.toFixed(2)} ms  errors ${r.errors}  ` +
                `client CPU ${r.clientCpuPct.toFixed(0)}%` +
                (r.firstError ? `  (first error: ${r.firstError})` : ""),
            );
          }
        } finally {
          client.close();
        }
      }
    }
  } finally {
    await server.stop();
  }
}

const setup = {
  node: process.version,
  concurrency,
  durationS: durationMs / 1000,
  warmupS: warmupMs / 1000,
  payloadBytes: payload.length,
  server: flags.target ?? serverBin(),
};
if (flags.json) {
  console.log(JSON.stringify({ setup, results }, null, 2));
} else {
  console.log(
    `\n${concurrency} concurrent enqueues from one Node ${process.version} process, ` +
      `${payload.length}-byte payloads, ${durationMs / 1000} s per point after ${warmupMs / 1000} s warm-up\n`,
  );
  console.log("| persist_mode | client | enqueues/s | p50 ms | p99 ms | client CPU | load avg |");
  console.log("|---|---|---:|---:|---:|---:|---:|");
  for (const r of results) {
    console.log(
      `| ${r.mode} | ${r.client} | ${r.enqueuesPerSec.toFixed(0)} | ${r.p50Ms.toFixed(2)} | ${r.p99Ms.toFixed(2)} | ${r.clientCpuPct.toFixed(0)}% | ${r.loadAverage.toFixed(1)} |`,
    );
  }
}
