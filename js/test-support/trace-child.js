// Child process of test/tracing.test.js, started with test-support/no-otel.cjs preloaded so
// that `@opentelemetry/api` cannot be loaded: enqueues (unary, batch, atomic), handles the jobs
// with a Worker, and prints `ok <json>` with what the handlers saw.
import { createRequire } from "node:module";
import { SeppClient, Worker } from "sepp";

let otel = "loadable";
try {
  createRequire(import.meta.url)("@opentelemetry/api");
} catch {
  otel = "absent";
}

const [url, queue] = process.argv.slice(2);
const client = await SeppClient.connect(url);
const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
await client.enqueue({ queue, jobType: "t", traceContext: { traceparent: explicit } });
await client.enqueueBatch([{ queue, jobType: "t" }]);
await client.enqueueAtomic([{ queue, jobType: "t" }]);
const worker = new Worker(client, { queues: [queue] });
/** @type {(string | null)[]} */
const seen = [];
worker.handle("t", async (job) => {
  seen.push(job.traceContext?.traceparent ?? null);
  if (seen.length === 3) void worker.stop();
});
const report = await worker.run();
client.close();
process.stdout.write(`ok ${JSON.stringify({ otel, seen: seen.sort(), acked: report.acked })}\n`);
