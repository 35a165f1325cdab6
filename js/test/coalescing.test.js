// Coalescing: concurrent enqueues of one client leave together, each caller gets its own
// result; `coalesce: false` makes one call per enqueue (counted by the server's metrics).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  IdempotencyKeyTooLongError,
  InvalidConfigError,
  JobTypeNotAllowedError,
  SeppClient,
} from "sepp";
import { startServer } from "../test-support/server.js";

const T = { timeout: 60_000 };

// The metrics endpoint's address is in the server's info log (this file runs in its own
// process, so the level applies to its server only).
process.env.SEPP_LOG = "info";

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {string} */
let metricsUrl;
let queueSeq = 0;
/** A queue no other test uses. */
const freshQueue = (name) => `${name}-${++queueSeq}`;

before(async () => {
  server = await startServer({
    extraToml: [
      "[metrics]",
      "enabled = true",
      'listen_addr = "127.0.0.1:0"',
      "[[queues]]",
      'name = "limited"',
      'allowed_job_types = ["ok"]',
    ].join("\n"),
  });
  const found = /metrics on (http:\/\/\S+\/metrics)/.exec(server.stderr());
  assert.ok(found, `no metrics address in the server's log:\n${server.stderr()}`);
  metricsUrl = found[1];
});

after(async () => {
  await server?.stop();
});

/** EnqueueBatch calls the server answered with OK so far. */
async function enqueueBatchCalls() {
  const text = await (await fetch(metricsUrl)).text();
  const found = /^sepp_rpc_duration_seconds_count\{rpc="EnqueueBatch",code="OK"\} (\d+)$/m.exec(text);
  return found ? Number(found[1]) : 0;
}

/**
 * Caller `i`'s job, by `i % 4`: keyed, unkeyed, refused by the client's checks (a key over the
 * advertised 256 bytes), or rejected by the server (a job type "limited" does not allow). The
 * job type `t${i}` tells the caller's job from the others'.
 */
function request(queue, i) {
  switch (i % 4) {
    case 0:
      return { queue, jobType: `t${i}`, idempotencyKey: `k-${i}` };
    case 1:
      return { queue, jobType: `t${i}` };
    case 2:
      return { queue, jobType: `t${i}`, idempotencyKey: "k".repeat(300) };
    default:
      return { queue: "limited", jobType: `t${i}` };
  }
}

describe("coalescing", T, () => {
  for (const coalesce of [true, false]) {
    test(`concurrent mixed enqueues each get their own result (coalesce: ${coalesce})`, async () => {
      const queue = freshQueue(`mixed-${coalesce}`);
      const client = await SeppClient.connect(server.url, { coalesce, maxBatchesInFlight: 1 });
      try {
        const results = await Promise.allSettled(
          Array.from({ length: 400 }, (_, i) => client.enqueue(request(queue, i))),
        );
        const ids = new Set();
        for (const [i, r] of results.entries()) {
          switch (i % 4) {
            case 0:
            case 1: {
              assert.equal(r.status, "fulfilled", `caller ${i}: ${r.reason}`);
              assert.ok(!ids.has(r.value.jobId), `caller ${i}: a shared job id`);
              ids.add(r.value.jobId);
              assert.equal((await client.getJob(r.value.jobId)).jobType, `t${i}`, `caller ${i}`);
              if (i % 4 === 0) {
                const record = await client.lookupIdempotencyKey(queue, `k-${i}`);
                assert.equal(record?.jobId, r.value.jobId, `caller ${i}`);
              }
              break;
            }
            case 2:
              assert.equal(r.status, "rejected", `caller ${i}`);
              assert.ok(r.reason instanceof IdempotencyKeyTooLongError, `caller ${i}: ${r.reason}`);
              assert.equal(r.reason.limit, 256);
              assert.equal(r.reason.actual, 300);
              break;
            default:
              assert.equal(r.status, "rejected", `caller ${i}`);
              assert.ok(r.reason instanceof JobTypeNotAllowedError, `caller ${i}: ${r.reason}`);
          }
        }
      } finally {
        client.close();
      }
    });
  }

  test("with coalesce: false each enqueue is its own call", async () => {
    const queue = freshQueue("off");
    const client = await SeppClient.connect(server.url, { coalesce: false });
    try {
      const before = await enqueueBatchCalls();
      const acks = await Promise.all(
        Array.from({ length: 100 }, (_, i) => client.enqueue({ queue, jobType: `t${i}` })),
      );
      assert.equal((await enqueueBatchCalls()) - before, 100);
      for (const [i, a] of acks.entries()) {
        assert.equal((await client.getJob(a.jobId)).jobType, `t${i}`);
      }
    } finally {
      client.close();
    }
  });

  test("maxBatchesInFlight must be at least 1", async () => {
    await assert.rejects(
      SeppClient.connect(server.url, { maxBatchesInFlight: 0 }),
      (/** @type {any} */ e) => e instanceof InvalidConfigError && /^maxBatchesInFlight is 0: it must be at least 1$/.test(e.message),
    );
  });
});
