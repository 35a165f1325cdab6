// Every call of SeppClient against the real server binary.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  AttemptMismatchError,
  IdempotencyKeyTooLongError,
  InvalidArgumentError,
  InvalidRequestError,
  JobNotInFlightError,
  JobRejectedError,
  SeppClient,
  SeppError,
} from "sepp";
import { startServer } from "../test-support/server.js";

const T = { timeout: 30_000 };

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {SeppClient} */
let client;
let queueSeq = 0;
/** A queue no other test uses. */
const freshQueue = (name) => `${name}-${++queueSeq}`;

before(async () => {
  server = await startServer({
    storage: "dead_letter_retention_ms = 600000",
    extraToml: '[[queues]]\nname = "debounced"\non_duplicate = "replace_pending"',
  });
  client = await SeppClient.connect(server.url, { rpcTimeoutMs: 10_000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** Reserves the one job of `queue` (failing when there is none). */
async function reserveOne(queue, leaseDurationMs = 30_000) {
  const jobs = await client.reserve({ queues: [queue], leaseDurationMs, waitTimeoutMs: 2_000 });
  assert.equal(jobs.length, 1, `one job on ${queue}`);
  return jobs[0];
}

describe("connect and getServerInfo", T, () => {
  test("getServerInfo returns the version, limits in bytes and durations in ms", async () => {
    const info = await client.getServerInfo();
    assert.match(info.serverVersion, /^\d+\.\d+\.\d+/);
    assert.deepEqual(info.supportedProtocolVersions, ["v1"]);
    assert.ok(info.serverTime instanceof Date);
    assert.ok(Math.abs(info.serverTime.getTime() - Date.now()) < 60_000);
    assert.equal(info.maxIdempotencyKeyBytes, 256);
    assert.equal(info.maxEnqueueBatch, 256);
    assert.equal(info.dedupWindowMs, 86_400_000);
    assert.equal(typeof info.maxLeaseDurationMs, "number");
    assert.equal(info.deadLetterRetentionEnabled, true);
  });

  test("connect accepts host:port without a scheme and every option", async () => {
    const other = await SeppClient.connect(server.addr, {
      rpcTimeoutMs: null,
      connectTimeoutMs: 5_000,
      maxReceiveBytes: 1 << 20,
      retryPolicy: { maxRetries: 2, firstRetryDelayMs: 10, maxRetryDelayMs: 100, multiplier: 2 },
    });
    try {
      assert.ok(other instanceof SeppClient);
      assert.equal((await other.getServerInfo()).maxReserveQueues, 32);
    } finally {
      other.close();
    }
    // The names of earlier releases are still accepted (deprecated), but not with the new.
    const old = await SeppClient.connect(server.addr, { retryPolicy: { maxAttempts: 3, initialBackoffMs: 10 } });
    old.close();
    await assert.rejects(
      SeppClient.connect(server.addr, { retryPolicy: { maxRetries: 2, maxAttempts: 3 } }),
      (/** @type {any} */ e) => e.code === "INVALID_CONFIG" && /not both/.test(e.message),
    );
  });
});

describe("enqueue", T, () => {
  test("keys are checked against the limit the server advertises, not 256", async () => {
    const big = await startServer({ extraToml: "[limits]\nmax_idempotency_key_bytes = 1024" });
    const c = await SeppClient.connect(big.url);
    try {
      const queue = freshQueue("keys");
      const ack = await c.enqueue({ queue, jobType: "t", idempotencyKey: "k".repeat(300) });
      assert.equal(ack.deduplicated, false);
      await assert.rejects(c.enqueue({ queue, jobType: "t", idempotencyKey: "k".repeat(1025) }), (e) => {
        assert.ok(e instanceof IdempotencyKeyTooLongError);
        assert.deepEqual([e.limit, e.actual], [1024, 1025]);
        return true;
      });
    } finally {
      c.close();
      await big.stop();
    }
  });

  test("enqueue returns a new job id, not deduplicated", async () => {
    const ack = await client.enqueue({ queue: freshQueue("plain"), jobType: "t" });
    assert.match(ack.jobId, /^[0-9a-f-]{36}$/);
    assert.equal(ack.deduplicated, false);
    assert.deepEqual(Object.keys(ack).sort(), ["deduplicated", "jobId", "replaced"]);
  });

  test("every field of a request comes back on the reserved job", async () => {
    const queue = freshQueue("fields");
    const big = 2n ** 60n + 1n;
    const ack = await client.enqueue({
      queue,
      jobType: "resize",
      payload: { data: Buffer.from('{"w":64}'), encoding: "application/json" },
      idempotencyKey: "resize-64",
      priority: 7,
      maxAttempts: 5,
      custom: { small: 42, negative: -7, ratio: 0.25, big, flag: true, label: "x" },
      traceContext: {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        tracestate: "k=v",
      },
      scheduledAt: new Date(Date.now() - 60_000),
    });
    const job = await reserveOne(queue);
    assert.equal(job.id, ack.jobId);
    assert.equal(job.queue, queue);
    assert.equal(job.jobType, "resize");
    assert.ok(job.payload?.data instanceof Uint8Array);
    assert.equal(Buffer.from(job.payload.data).toString(), '{"w":64}');
    assert.equal(job.payload.encoding, "application/json");
    assert.equal(job.priority, 7);
    assert.equal(job.maxAttempts, 5);
    assert.equal(job.attempt, 1);
    assert.deepEqual(job.custom, {
      small: 42,
      negative: -7,
      ratio: 0.25,
      big,
      flag: true,
      label: "x",
    });
    assert.equal(typeof job.custom.big, "bigint", "int64 beyond 2^53 comes back as bigint");
    assert.equal(typeof job.custom.small, "number");
    assert.deepEqual(job.traceContext, {
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "k=v",
    });
    assert.ok(job.enqueuedAt instanceof Date);
    assert.ok(job.leaseExpiresAt instanceof Date);
    assert.ok(job.leaseExpiresAt.getTime() > Date.now());
    await client.ack(job.id, job.attempt);
  });

  test("int64 custom values round-trip: safe integers as numbers, the rest as bigints", async () => {
    const queue = freshQueue("int64");
    const custom = {
      min: -(2n ** 63n),
      max: 2n ** 63n - 1n,
      safe: Number.MAX_SAFE_INTEGER,
      unsafe: -(2n ** 53n),
      small: 5n,
      zero: -0,
    };
    await client.enqueue({ queue, jobType: "t", custom });
    const job = await reserveOne(queue);
    assert.deepEqual(job.custom, {
      min: -(2n ** 63n),
      max: 2n ** 63n - 1n,
      safe: Number.MAX_SAFE_INTEGER,
      unsafe: -(2n ** 53n),
      small: 5,
      zero: 0,
    });
  });

  test("a plain Uint8Array payload is accepted", async () => {
    const queue = freshQueue("bytes");
    await client.enqueue({
      queue,
      jobType: "t",
      payload: { data: new Uint8Array([0, 1, 255]), encoding: "application/octet-stream" },
    });
    const job = await reserveOne(queue);
    assert.deepEqual([...(job.payload?.data ?? [])], [0, 1, 255]);
  });

  test("a job scheduled in the future is not ready yet", async () => {
    const queue = freshQueue("scheduled");
    const at = new Date(Date.now() + 3_600_000);
    await client.enqueue({ queue, jobType: "t", scheduledAt: at });
    const jobs = await client.reserve({ queues: [queue], leaseDurationMs: 1_000 });
    assert.deepEqual(jobs, []);
  });
});

describe("dedup walkthrough", T, () => {
  test("the same key twice gives the same id, and the second is deduplicated", async () => {
    const queue = freshQueue("receipts");
    const first = await client.enqueue({
      queue,
      jobType: "receipt",
      idempotencyKey: "order-1001",
    });
    const second = await client.enqueue({
      queue,
      jobType: "receipt",
      idempotencyKey: "order-1001",
    });
    assert.equal(first.deduplicated, false);
    assert.equal(second.deduplicated, true);
    assert.equal(second.jobId, first.jobId);

    // One job exists, not two.
    const jobs = await client.reserve({ queues: [queue], leaseDurationMs: 5_000, maxJobs: 10 });
    assert.deepEqual(
      jobs.map((j) => j.id),
      [first.jobId],
    );
  });

  test("the same key on another queue is another job", async () => {
    const a = await client.enqueue({ queue: freshQueue("a"), jobType: "t", idempotencyKey: "k" });
    const b = await client.enqueue({ queue: freshQueue("b"), jobType: "t", idempotencyKey: "k" });
    assert.notEqual(a.jobId, b.jobId);
    assert.equal(b.deduplicated, false);
  });

  test("a dedup hit still names the job after it was acked", async () => {
    const queue = freshQueue("acked");
    const first = await client.enqueue({ queue, jobType: "t", idempotencyKey: "done-1" });
    const job = await reserveOne(queue);
    await client.ack(job.id, job.attempt);
    const again = await client.enqueue({ queue, jobType: "t", idempotencyKey: "done-1" });
    assert.deepEqual(again, {
      jobId: first.jobId,
      deduplicated: true,
      originalState: "acked",
      replaced: false,
    });
  });

  test("a hit on a pending job of a debounced queue replaces its payload", async () => {
    // "debounced" has on_duplicate = "replace_pending" (see `before`).
    const version = (/** @type {string} */ v) => ({
      queue: "debounced",
      jobType: "index",
      idempotencyKey: "doc-1",
      payload: { data: Buffer.from(v), encoding: "text/plain" },
    });
    const first = await client.enqueue(version("v1"));
    assert.equal(first.replaced, false);
    const second = await client.enqueue(version("v2"));
    assert.deepEqual(second, {
      jobId: first.jobId,
      deduplicated: true,
      originalState: "ready",
      replaced: true,
    });
    const job = await reserveOne("debounced");
    assert.equal(Buffer.from(job.payload?.data ?? []).toString(), "v2");
    // In flight: a hit keeps the job as it is.
    const third = await client.enqueue(version("v3"));
    assert.equal(third.replaced, false);
    assert.equal(third.originalState, "inFlight");
    await client.ack(job.id, job.attempt);
  });
});

describe("enqueueBatch and enqueueAtomic", T, () => {
  test("enqueueBatch returns one result per job, rejections as SeppError values", async () => {
    const queue = freshQueue("batch");
    const results = await client.enqueueBatch([
      { queue, jobType: "t", idempotencyKey: "b-1" },
      { queue: "", jobType: "t" },
      { queue, jobType: "t", idempotencyKey: "b-1" },
      { queue, jobType: "t", priority: 10 },
      { queue, jobType: "t" },
    ]);
    assert.equal(results.length, 5);
    const [first, empty, dup, priority, last] = results;
    assert.equal(first.status, "enqueued");
    assert.equal(dup.status, "enqueued");
    assert.equal(last.status, "enqueued");
    if (first.status !== "enqueued" || dup.status !== "enqueued") return;
    assert.equal(first.deduplicated, false);
    assert.equal(dup.jobId, first.jobId, "the second job with a key is a dedup hit of the first");
    assert.equal(dup.deduplicated, true);
    for (const r of [empty, priority]) {
      assert.equal(r.status, "rejected");
      if (r.status !== "rejected") continue;
      assert.ok(r.error instanceof InvalidRequestError);
      assert.ok(r.error instanceof JobRejectedError);
      assert.equal(r.error.code, "INVALID_REQUEST");
      assert.equal(r.error.retryable, false);
    }
  });

  test("enqueueBatch refuses an empty batch and one over maxEnqueueBatch", async () => {
    await assert.rejects(client.enqueueBatch([]), InvalidArgumentError);
    const tooMany = Array.from({ length: 257 }, () => ({ queue: "q", jobType: "t" }));
    await assert.rejects(client.enqueueBatch(tooMany), (e) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.match(e.message, /max_enqueue_batch is 256/);
      return true;
    });
  });

  test("enqueueAtomic commits every job in order", async () => {
    const queue = freshQueue("atomic");
    const result = await client.enqueueAtomic([
      { queue, jobType: "first" },
      { queue, jobType: "second" },
    ]);
    assert.equal(result.status, "committed");
    if (result.status !== "committed") return;
    assert.equal(result.acks.length, 2);
    const jobs = await client.reserve({ queues: [queue], leaseDurationMs: 5_000, maxJobs: 5 });
    assert.deepEqual(jobs.map((j) => j.id).sort(), result.acks.map((a) => a.jobId).sort());
  });

  test("enqueueAtomic writes nothing when a job is refused, and lists each failure", async () => {
    const queue = freshQueue("atomic-fail");
    const result = await client.enqueueAtomic([
      { queue, jobType: "ok" },
      { queue, jobType: "" },
      { queue, jobType: "ok", idempotencyKey: "x".repeat(300) },
    ]);
    assert.equal(result.status, "rejected");
    if (result.status !== "rejected") return;
    assert.deepEqual(
      result.failures.map((f) => [f.index, f.error.code]),
      [
        [1, "INVALID_REQUEST"],
        [2, "IDEMPOTENCY_KEY_TOO_LONG"],
      ],
    );
    assert.ok(result.failures.every((f) => f.error instanceof SeppError));
    assert.deepEqual(await client.reserve({ queues: [queue], leaseDurationMs: 1_000 }), []);
  });
});

describe("reserve, ack, nack, extend, drainDeadLetters", T, () => {
  test("reserve on an empty queue waits up to waitTimeoutMs and returns []", async () => {
    const started = Date.now();
    const jobs = await client.reserve({
      queues: [freshQueue("empty")],
      leaseDurationMs: 1_000,
      waitTimeoutMs: 200,
    });
    assert.deepEqual(jobs, []);
    assert.ok(Date.now() - started >= 150);
  });

  test("reserve takes up to maxJobs jobs across queues in order", async () => {
    const q1 = freshQueue("multi");
    const q2 = freshQueue("multi");
    await client.enqueue({ queue: q2, jobType: "second" });
    await client.enqueue({ queue: q1, jobType: "first" });
    await client.enqueue({ queue: q1, jobType: "first" });
    const jobs = await client.reserve({
      queues: [q1, q2],
      leaseDurationMs: 5_000,
      maxJobs: 2,
      workerId: "w-1",
    });
    assert.deepEqual(
      jobs.map((j) => j.jobType),
      ["first", "first"],
    );
  });

  test("ack removes the job, and a second ack rejects with JobNotInFlight", async () => {
    const queue = freshQueue("ack");
    await client.enqueue({ queue, jobType: "t" });
    const job = await reserveOne(queue);
    assert.equal(await client.ack(job.id, job.attempt), undefined);
    await assert.rejects(client.ack(job.id, job.attempt), (e) => {
      assert.ok(e instanceof JobNotInFlightError);
      assert.ok(e instanceof SeppError);
      assert.equal(e.code, "JOB_NOT_IN_FLIGHT");
      assert.equal(e.jobId, job.id);
      assert.equal(e.retryable, false);
      return true;
    });
  });

  test("ackThenReserve acks and brings the next job; a refused ack leases nothing", async () => {
    const queue = freshQueue("ack-next");
    await client.enqueue({ queue, jobType: "t" });
    await client.enqueue({ queue, jobType: "t" });
    const job = await reserveOne(queue);
    const next = { queues: [queue], leaseDurationMs: 5_000 };
    await assert.rejects(
      client.ackThenReserve(job.id, job.attempt, { ...next, waitTimeoutMs: 1_000 }),
      (e) => e instanceof InvalidArgumentError,
    );
    await assert.rejects(
      client.ackThenReserve(job.id, job.attempt + 1, next),
      (e) => e instanceof AttemptMismatchError,
    );
    const brought = await client.ackThenReserve(job.id, job.attempt, next);
    assert.equal(brought.length, 1);
    assert.notEqual(brought[0].id, job.id);
    assert.equal(brought[0].attempt, 1);
    await assert.rejects(client.ack(job.id, job.attempt), (e) => e instanceof JobNotInFlightError);
    assert.deepEqual(await client.ackThenReserve(brought[0].id, 1, next), []);
    await assert.rejects(client.ack(brought[0].id, 1), (e) => e instanceof JobNotInFlightError);
  });

  test("nack with the default retry redelivers the job as attempt 2", async () => {
    const queue = freshQueue("nack");
    await client.enqueue({ queue, jobType: "t", maxAttempts: 3 });
    const first = await reserveOne(queue);
    assert.equal(await client.nack(first.id, first.attempt, { reason: "flaky" }), false);
    const second = await reserveOne(queue);
    assert.equal(second.id, first.id);
    assert.equal(second.attempt, 2);
    // The first delivery's lease is gone: its attempt no longer matches.
    await assert.rejects(client.ack(first.id, first.attempt), AttemptMismatchError);
    await client.ack(second.id, second.attempt);
  });

  test("nack with delayMs schedules the retry", async () => {
    const queue = freshQueue("delay");
    await client.enqueue({ queue, jobType: "t" });
    const job = await reserveOne(queue);
    assert.equal(await client.nack(job.id, job.attempt, { retry: { delayMs: 60_000 } }), false);
    assert.deepEqual(await client.reserve({ queues: [queue], leaseDurationMs: 1_000 }), []);
  });

  test("nack on the last attempt dead-letters the job", async () => {
    const queue = freshQueue("last");
    await client.enqueue({ queue, jobType: "t", maxAttempts: 1 });
    const job = await reserveOne(queue);
    assert.equal(await client.nack(job.id, job.attempt, { retry: "default" }), true);
    const [record] = await client.drainDeadLetters({ queue, max: 10 });
    assert.equal(record.job.id, job.id);
    assert.equal(record.cause, "attemptsExhausted");
  });

  test("nack with deadLetter, then drainDeadLetters returns and removes the record", async () => {
    const queue = freshQueue("dead");
    const ack = await client.enqueue({
      queue,
      jobType: "t",
      payload: { data: Buffer.from("p"), encoding: "text/plain" },
    });
    const job = await reserveOne(queue);
    assert.equal(
      await client.nack(job.id, job.attempt, { retry: "deadLetter", reason: "bad input" }),
      true,
    );
    const records = await client.drainDeadLetters({ queue, max: 10 });
    assert.equal(records.length, 1);
    const [record] = records;
    assert.equal(record.job.id, ack.jobId);
    assert.equal(record.job.queue, queue);
    assert.equal(Buffer.from(record.job.payload?.data ?? []).toString(), "p");
    assert.equal(record.cause, "rejected");
    assert.equal(record.finalAttempt, 1);
    assert.equal(record.lastReason, "bad input");
    assert.ok(record.failedAt instanceof Date);
    assert.deepEqual(await client.drainDeadLetters({ queue, max: 10 }), []);
  });

  test("extend moves leaseExpiresAt out and returns it as a Date", async () => {
    const queue = freshQueue("extend");
    await client.enqueue({ queue, jobType: "t" });
    const job = await reserveOne(queue, 1_000);
    const until = await client.extend(job.id, job.attempt, 120_000);
    assert.ok(until instanceof Date);
    assert.ok(until.getTime() > (job.leaseExpiresAt?.getTime() ?? 0) + 60_000);
    await client.ack(job.id, job.attempt);
    await assert.rejects(client.extend(job.id, job.attempt, 1_000), JobNotInFlightError);
  });
});

describe("concurrency and close", T, () => {
  test("1,000 concurrent enqueues all succeed with distinct ids", async () => {
    const queue = freshQueue("load");
    const acks = await Promise.all(
      Array.from({ length: 1_000 }, (_, i) =>
        client.enqueue({ queue, jobType: "t", idempotencyKey: `load-${i}` }),
      ),
    );
    assert.equal(new Set(acks.map((a) => a.jobId)).size, 1_000);
    assert.ok(acks.every((a) => !a.deduplicated));
  });

  test("concurrent enqueues of one key create exactly one job", async () => {
    const queue = freshQueue("race");
    const acks = await Promise.all(
      Array.from({ length: 200 }, () =>
        client.enqueue({ queue, jobType: "t", idempotencyKey: "same" }),
      ),
    );
    assert.equal(new Set(acks.map((a) => a.jobId)).size, 1);
    assert.equal(acks.filter((a) => !a.deduplicated).length, 1);
  });

  test("a closed client rejects new calls with ERR_SEPP_CLIENT_CLOSED", async () => {
    const other = await SeppClient.connect(server.url);
    const pending = other.getServerInfo();
    other.close();
    other.close();
    await pending; // a call in flight finishes
    await assert.rejects(other.enqueue({ queue: "q", jobType: "t" }), (e) => {
      assert.ok(e instanceof Error);
      assert.ok(!(e instanceof SeppError));
      assert.equal(/** @type {any} */ (e).code, "ERR_SEPP_CLIENT_CLOSED");
      return true;
    });
  });

  test("the constructor refuses direct use", () => {
    assert.throws(() => new SeppClient(), TypeError);
  });
});
