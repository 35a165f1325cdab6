// The operator calls (sepp.admin.v1) against the real server binary.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidArgumentError, SeppClient } from "sepp";
import { startServer } from "../test-support/server.js";

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {SeppClient} */
let client;

before(async () => {
  server = await startServer({ storage: "dead_letter_retention_ms = 600000" });
  client = await SeppClient.connect(server.url);
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** Enqueues `n` jobs on `queue` and dead-letters them all; returns their ids, oldest first. */
async function deadLetters(queue, n) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    ids.push((await client.enqueue({ queue, jobType: "t" })).jobId);
  }
  const jobs = await client.reserve({ queues: [queue], leaseDurationMs: 10_000, maxJobs: n });
  for (const job of jobs) {
    await client.nack(job.id, job.attempt, { retry: "deadLetter", reason: `no ${job.id}` });
  }
  return ids;
}

describe("admin calls", { timeout: 30_000 }, () => {
  test("getJob follows a job from ready to in flight to completed", async () => {
    const { jobId } = await client.enqueue({
      queue: "inspect",
      jobType: "t",
      idempotencyKey: "inspect-1",
      priority: 3,
    });
    const ready = await client.getJob(jobId);
    assert.equal(ready.jobId, jobId);
    assert.equal(ready.state, "ready");
    assert.equal(ready.queue, "inspect");
    assert.equal(ready.priority, 3);
    assert.equal(ready.attempt, 0);
    assert.equal(ready.idempotencyKey, "inspect-1");
    assert.ok(ready.enqueuedAt instanceof Date);

    const [job] = await client.reserve({
      queues: ["inspect"],
      leaseDurationMs: 10_000,
      workerId: "w-7",
    });
    const inFlight = await client.getJob(jobId);
    assert.equal(inFlight.state, "inFlight");
    assert.equal(inFlight.attempt, 1);
    assert.equal(inFlight.workerId, "w-7");
    assert.ok(inFlight.leaseExpiresAt instanceof Date);

    await client.ack(job.id, job.attempt);
    assert.equal((await client.getJob(jobId)).state, "acked");
  });

  test("getJob of an id the server never saw is unknown", async () => {
    const info = await client.getJob("00000000-0000-4000-8000-000000000000");
    assert.equal(info.state, "unknown");
  });

  test("lookupIdempotencyKey finds a live key and null for an unused one", async () => {
    const { jobId } = await client.enqueue({ queue: "keys", jobType: "t", idempotencyKey: "k-1" });
    const record = await client.lookupIdempotencyKey("keys", "k-1");
    assert.equal(record?.jobId, jobId);
    assert.ok(record?.createdAt instanceof Date);
    assert.ok(record?.expiresAt instanceof Date);
    assert.ok(record.expiresAt.getTime() - record.createdAt.getTime() >= 86_399_000);
    assert.equal(await client.lookupIdempotencyKey("keys", "never-used"), null);
    await assert.rejects(client.lookupIdempotencyKey("", "k"), InvalidArgumentError);
  });

  test("listDeadLetters pages without removing; requeue and delete take them out", async () => {
    const ids = await deadLetters("dlq", 3);
    const first = await client.listDeadLetters({ queue: "dlq", pageSize: 2 });
    assert.equal(first.records.length, 2);
    assert.equal(typeof first.nextPageToken, "string");
    const second = await client.listDeadLetters({ queue: "dlq", pageToken: first.nextPageToken });
    assert.equal(second.records.length, 1);
    assert.equal(second.nextPageToken, undefined);
    assert.deepEqual(
      [...first.records, ...second.records].map((r) => r.job.id).sort(),
      [...ids].sort(),
    );
    assert.equal(second.records[0]?.cause, "rejected");

    const [one, ...rest] = [...first.records, ...second.records].map((r) => r.job.id);
    assert.deepEqual(await client.requeueDeadLetters({ jobIds: [one] }), [one]);
    const [again] = await client.reserve({ queues: ["dlq"], leaseDurationMs: 5_000 });
    assert.equal(again?.id, one);
    assert.equal(again?.attempt, 1);

    assert.deepEqual((await client.deleteDeadLetters({ queue: "dlq", max: 10 })).sort(), rest.sort());
    assert.deepEqual((await client.listDeadLetters({ queue: "dlq" })).records, []);
    await assert.rejects(client.deleteDeadLetters({ max: 0 }), InvalidArgumentError);
  });

  test("a paused queue is skipped by reserve until resumed; stats count its jobs", async () => {
    await client.enqueue({ queue: "paused", jobType: "t" });
    await client.enqueue({ queue: "paused", jobType: "t", scheduledAt: new Date(Date.now() + 3_600_000) });
    await client.pauseQueue("paused");
    let stats = await client.getQueueStats("paused");
    assert.deepEqual(stats, {
      ready: 1,
      scheduled: 1,
      inFlight: 0,
      deadLettered: 0,
      dedupRecords: 0,
      paused: true,
    });
    assert.deepEqual(await client.reserve({ queues: ["paused"], leaseDurationMs: 1_000 }), []);
    await client.resumeQueue("paused");
    const jobs = await client.reserve({ queues: ["paused"], leaseDurationMs: 5_000 });
    assert.equal(jobs.length, 1);
    stats = await client.getQueueStats("paused");
    assert.equal(stats.inFlight, 1);
    assert.equal(stats.paused, false);
  });

  test("mistyped arguments reject with a TypeError", async () => {
    const c = /** @type {any} */ (client);
    await assert.rejects(c.getJob(1), TypeError);
    await assert.rejects(c.lookupIdempotencyKey("q"), TypeError);
    await assert.rejects(c.listDeadLetters({ pageSize: "2" }), TypeError);
    await assert.rejects(c.requeueDeadLetters({ jobIds: "x" }), TypeError);
    await assert.rejects(c.deleteDeadLetters({ queue: "q" }), TypeError);
    await assert.rejects(c.pauseQueue(), TypeError);
  });
});
