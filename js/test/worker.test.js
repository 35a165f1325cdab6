// The Worker (and the engine under it) against the real server binary: outcomes, lease loss,
// shutdown, concurrency, bad options. The server keeps dead letters, so they can be inspected.

import assert from "node:assert/strict";
import { once } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";
import {
  Engine,
  HandlerError,
  InvalidArgumentError,
  JobNotInFlightError,
  SeppClient,
  Worker,
} from "sepp";
import { startServer } from "../test-support/server.js";

const T = { timeout: 30_000 };

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {SeppClient} */
let client;
let queueSeq = 0;
/** A queue no other test uses. */
const freshQueue = (/** @type {string} */ name) => `${name}-${++queueSeq}`;

before(async () => {
  server = await startServer({ storage: "dead_letter_retention_ms = 60000\nsweep_interval_ms = 50" });
  client = await SeppClient.connect(server.url, { rpcTimeoutMs: 10_000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** A Promise with its resolve function. */
function deferred() {
  /** @type {(value?: any) => void} */
  let resolve = () => {};
  /** @type {Promise<any>} */
  const promise = new Promise((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** `promise`, or a rejection naming `what` after `ms` milliseconds. */
async function within(promise, ms, what) {
  const timeout = AbortSignal.timeout(ms);
  const expired = once(timeout, "abort").then(() => {
    throw new Error(`timed out after ${ms} ms waiting for ${what}`);
  });
  return Promise.race([promise, expired]);
}

/** Runs `worker` until `until` resolves, then stops it; resolves to its report. */
async function runUntil(worker, until, what = "the handlers") {
  const run = worker.run();
  try {
    await within(until, 15_000, what);
  } finally {
    await worker.stop();
  }
  return run;
}

/** Polls getJob until `test(info)` holds (a deadline poll: the server has no push for it). */
async function jobWhen(jobId, check, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const info = await client.getJob(jobId);
    if (check(info)) return info;
    if (Date.now() > deadline) assert.fail(`job ${jobId} never matched: ${JSON.stringify(info)}`);
    await sleep(25);
  }
}

const gone = (/** @type {{ state: string }} */ info) => ["acked", "unknown"].includes(info.state);

describe("outcomes", T, () => {
  test("a job failing every attempt is retried, then dead-lettered with its last reason", async () => {
    const queue = freshQueue("retries");
    const { jobId } = await client.enqueue({ queue, jobType: "flaky", maxAttempts: 3 });
    const attempts = [];
    const third = deferred();
    const worker = new Worker(client, { queues: [queue] }).handle("flaky", async (job) => {
      attempts.push(job.attempt);
      if (job.attempt === 3) third.resolve();
      throw HandlerError.retry(`attempt ${job.attempt} failed`);
    });
    const report = await runUntil(worker, third.promise, "the third attempt");

    assert.deepEqual(attempts, [1, 2, 3]);
    assert.deepEqual(report, { acked: 0, nacked: 3, leaseLost: 0, abandoned: 0 });
    const info = await client.getJob(jobId);
    assert.equal(info.state, "deadLettered");
    assert.equal(info.attempt, 3);
    assert.equal(info.lastReason, "attempt 3 failed");
    assert.equal(info.deadLetterCause, "attemptsExhausted");
    const { records } = await client.listDeadLetters({ queue });
    assert.equal(records.length, 1);
    assert.equal(records[0].job.id, jobId);
    assert.equal(records[0].finalAttempt, 3);
    assert.equal(records[0].lastReason, "attempt 3 failed");
  });

  test("HandlerError.retryAfter schedules the next attempt that many milliseconds later", async () => {
    const queue = freshQueue("retry-after");
    const { jobId } = await client.enqueue({ queue, jobType: "t" });
    const ran = deferred();
    const before = Date.now();
    const worker = new Worker(client, { queues: [queue] }).handle("t", async () => {
      ran.resolve();
      throw HandlerError.retryAfter(60_000, "rate limited");
    });
    const report = await runUntil(worker, ran.promise);

    assert.equal(report.nacked, 1);
    const info = await client.getJob(jobId);
    assert.equal(info.state, "scheduled");
    assert.equal(info.attempt, 1);
    assert.equal(info.lastReason, "rate limited");
    assert.ok(info.scheduledAt instanceof Date);
    const delay = info.scheduledAt.getTime() - before;
    assert.ok(delay > 55_000 && delay < 70_000, `scheduled ${delay} ms later`);
  });

  test("HandlerError.permanent dead-letters the job on its first attempt", async () => {
    const queue = freshQueue("permanent");
    const { jobId } = await client.enqueue({ queue, jobType: "t", maxAttempts: 5 });
    const ran = deferred();
    const worker = new Worker(client, { queues: [queue] }).handle("t", async () => {
      ran.resolve();
      throw HandlerError.permanent("malformed");
    });
    const report = await runUntil(worker, ran.promise);

    assert.equal(report.nacked, 1);
    const info = await client.getJob(jobId);
    assert.equal(info.state, "deadLettered");
    assert.equal(info.attempt, 1);
    assert.equal(info.lastReason, "malformed");
    assert.equal(info.deadLetterCause, "rejected");
  });

  test("any other thrown value is retried with the queue's policy, and the worker goes on", async () => {
    const queue = freshQueue("thrown");
    const asyncJob = await client.enqueue({ queue, jobType: "async", maxAttempts: 3 });
    const syncJob = await client.enqueue({ queue, jobType: "sync", maxAttempts: 3 });
    const reasonsSeen = new Map();
    const both = [deferred(), deferred()];
    /** @type {[unknown, string, number][]} */
    const reported = [];
    const onError = (/** @type {unknown} */ err, /** @type {import("sepp").Job} */ job) => {
      reported.push([err, job.jobType, job.attempt]);
    };
    const worker = new Worker(client, { queues: [queue], onError })
      .handle("async", async (job) => {
        if (job.attempt === 1) throw new TypeError("kaboom");
        reasonsSeen.set("async", (await client.getJob(job.id)).lastReason);
        both[0].resolve();
      })
      // Not async, and throws a string: still a retry, not a crash.
      .handle("sync", (job) => {
        if (job.attempt === 1) throw "plain string";
        both[1].resolve();
      });
    const report = await runUntil(worker, Promise.all(both.map((d) => d.promise)));

    assert.equal(reasonsSeen.get("async"), "kaboom");
    assert.deepEqual(report, { acked: 2, nacked: 2, leaseLost: 0, abandoned: 0 });
    // Each unexpected throw reached onError once, with the thrown value and the job.
    assert.equal(reported.length, 2);
    const byType = new Map(reported.map(([err, type, attempt]) => [type, { err, attempt }]));
    assert.ok(byType.get("async")?.err instanceof TypeError);
    assert.equal(byType.get("async")?.attempt, 1);
    assert.equal(byType.get("sync")?.err, "plain string");
    assert.ok(gone(await client.getJob(asyncJob.jobId)));
    assert.ok(gone(await client.getJob(syncJob.jobId)));
  });

  test("a job type without a handler is nacked with the retry policy; the fallback takes the rest", async () => {
    const queue = freshQueue("missing");
    const nobody = await client.enqueue({ queue, jobType: "nobody", maxAttempts: 1 });
    const known = await client.enqueue({ queue, jobType: "known" });
    const ran = deferred();
    const worker = new Worker(client, { queues: [queue], maxInFlight: 1 }).handle("known", async () => {
      ran.resolve();
    });
    const report = await runUntil(worker, ran.promise);
    assert.equal(report.acked, 1);
    assert.equal(report.nacked, 1);
    const info = await client.getJob(nobody.jobId);
    assert.equal(info.state, "deadLettered", "its only attempt failed");
    assert.equal(info.lastReason, 'no handler for job type "nobody"');
    assert.ok(gone(await client.getJob(known.jobId)));

    const other = freshQueue("fallback");
    await client.enqueue({ queue: other, jobType: "whatever" });
    const types = deferred();
    const withFallback = new Worker(client, { queues: [other] })
      .handle("known", async () => assert.fail("not this one"))
      .fallback(async (job) => types.resolve(job.jobType));
    const fallbackReport = await runUntil(withFallback, types.promise);
    assert.equal(await types.promise, "whatever");
    assert.equal(fallbackReport.acked, 1);
  });
});

describe("leases", T, () => {
  test("when the lease is lost, the handler's signal is aborted and the job counted as leaseLost", async () => {
    const queue = freshQueue("lost");
    const { jobId } = await client.enqueue({ queue, jobType: "t", maxAttempts: 5 });
    const started = deferred();
    const aborted = deferred();
    const worker = new Worker(client, { queues: [queue], leaseDurationMs: 900, maxInFlight: 1 }).handle(
      "t",
      async (job, { signal, leaseExpiresAt }) => {
        assert.ok(leaseExpiresAt instanceof Date);
        started.resolve(job);
        await once(signal, "abort");
        aborted.resolve(signal.reason);
      },
    );
    const run = worker.run();
    const job = await within(started.promise, 10_000, "the handler");
    // Someone else settles the job: the next extension finds it gone.
    await client.nack(job.id, job.attempt, { retry: { delayMs: 60_000 }, reason: "taken away" });
    const reason = await within(aborted.promise, 10_000, "the abort");
    assert.ok(reason instanceof DOMException);
    assert.equal(reason.name, "AbortError");
    assert.equal(reason.message, "the lease was lost: the job will be delivered again");
    await worker.stop();
    const report = await run;
    assert.equal(report.leaseLost, 1);
    assert.equal(report.acked + report.nacked, 0);
    assert.equal((await client.getJob(jobId)).lastReason, "taken away");
  });

  test(
    "with autoExtend false, the signal is aborted when the short lease runs out",
    T,
    async () => {
      const queue = freshQueue("no-extend-abort");
      await client.enqueue({ queue, jobType: "t", maxAttempts: 5 });
      const aborted = deferred();
      const worker = new Worker(client, {
        queues: [queue],
        leaseDurationMs: 300,
        autoExtend: false,
        maxInFlight: 1,
      }).handle("t", async (_job, { signal }) => {
        await once(signal, "abort");
        aborted.resolve(signal.reason);
      });
      const report = await runUntil(worker, aborted.promise, "the abort");
      assert.equal((await aborted.promise).message, "the lease was lost: the job will be delivered again");
      assert.ok(report.leaseLost >= 1, JSON.stringify(report));
    },
  );
});

describe("the engine's policy", T, () => {
  test("a lost lease on the last attempt is left to the server's expiry: LEASE_EXPIRED, no nack", async () => {
    const queue = freshQueue("lost-last");
    const { jobId } = await client.enqueue({ queue, jobType: "t", maxAttempts: 1 });
    const aborted = deferred();
    const worker = new Worker(client, { queues: [queue], leaseDurationMs: 500, autoExtend: false }).handle(
      "t",
      async (_job, { signal }) => {
        await once(signal, "abort");
        aborted.resolve(signal.reason);
      },
    );
    const report = await runUntil(worker, jobWhen(jobId, (info) => info.state === "deadLettered"));
    assert.equal((await aborted.promise).message, "the lease was lost: the job will be delivered again");
    assert.deepEqual(report, { acked: 0, nacked: 0, leaseLost: 1, abandoned: 0 });
    const info = await client.getJob(jobId);
    assert.equal(info.deadLetterCause, "leaseExpired");
    assert.equal(info.attempt, 1);
  });

  test("a handler past handlerTimeoutMs is aborted and its job nacked with a reason saying so", async () => {
    const queue = freshQueue("timeout");
    const { jobId } = await client.enqueue({ queue, jobType: "t", maxAttempts: 1 });
    const aborted = deferred();
    /** @type {unknown[]} */
    const reported = [];
    const onError = (/** @type {unknown} */ err) => {
      reported.push(err);
    };
    const worker = new Worker(client, { queues: [queue], handlerTimeoutMs: 300, onError }).handle("t", async (_job, { signal }) => {
      await once(signal, "abort");
      aborted.resolve(signal.reason);
      // What a handler that passes its signal on (fetch, timers/promises) ends with.
      signal.throwIfAborted();
    });
    const report = await runUntil(worker, jobWhen(jobId, (info) => info.state === "deadLettered"));
    assert.match((await aborted.promise).message, /handler_timeout/);
    // The AbortError thrown after the engine let go of the job is not a handler failure.
    assert.deepEqual(reported, []);
    assert.deepEqual(report, { acked: 0, nacked: 1, leaseLost: 0, abandoned: 0 });
    const info = await client.getJob(jobId);
    assert.equal(info.lastReason, "the handler ran past handler_timeout (300 ms)");
    assert.equal(info.deadLetterCause, "attemptsExhausted");
  });
});

describe("shutdown", T, () => {
  test("stop() lets a running handler finish, and its job is acked", async () => {
    const queue = freshQueue("graceful");
    const { jobId } = await client.enqueue({ queue, jobType: "t" });
    const started = deferred();
    const release = deferred();
    let finished = false;
    let abortedSignal = false;
    const worker = new Worker(client, { queues: [queue] }).handle("t", async (_job, { signal }) => {
      started.resolve();
      await release.promise;
      finished = true;
      abortedSignal = signal.aborted;
    });
    const run = worker.run();
    await within(started.promise, 10_000, "the handler");
    // The handler goes on after the stop began; the stop waits for it.
    const stopping = worker.stop();
    release.resolve();
    await stopping;
    const report = await run;
    assert.equal(finished, true);
    assert.equal(abortedSignal, false);
    assert.deepEqual(report, { acked: 1, nacked: 0, leaseLost: 0, abandoned: 0 });
    // The names of earlier releases, deprecated and not enumerable.
    assert.deepEqual([report.succeeded, report.failed], [1, 0]);
    assert.ok(gone(await client.getJob(jobId)));
  });

  test("handlers past shutdownTimeoutMs are aborted and their jobs nacked back to ready", async () => {
    const queue = freshQueue("too-slow");
    const polite = await client.enqueue({ queue, jobType: "polite", maxAttempts: 3 });
    const stubborn = await client.enqueue({ queue, jobType: "stubborn", maxAttempts: 3 });
    const started = [deferred(), deferred()];
    /** @type {unknown} */
    let reason;
    /** @type {AbortSignal | undefined} */
    let stubbornSignal;
    const worker = new Worker(client, { queues: [queue], shutdownTimeoutMs: 200, maxInFlight: 2 })
      .handle("polite", async (_job, { signal }) => {
        started[0].resolve();
        await once(signal, "abort");
        reason = signal.reason;
        throw signal.reason;
      })
      // Ignores its signal and never ends: the worker must not wait for it.
      .handle("stubborn", async (_job, { signal }) => {
        stubbornSignal = signal;
        started[1].resolve();
        await new Promise(() => {});
      });
    const lines = /** @type {string[]} */ ([]);
    const original = console.error;
    console.error = (...args) => {
      lines.push(args.map(String).join(" "));
    };
    let took = 0;
    /** @type {import("sepp").WorkerReport} */
    let report;
    try {
      const run = worker.run();
      await within(Promise.all(started.map((d) => d.promise)), 10_000, "both handlers");
      const t0 = Date.now();
      await worker.stop();
      report = await run;
      took = Date.now() - t0;
    } finally {
      console.error = original;
    }

    // One notice as the stop began (the core's words, as in Rust and Python); the polite
    // handler's rethrown AbortError is not logged as a handler failure.
    assert.deepEqual(lines, [
      "sepp worker stopping: waiting up to 200 ms (shutdown_timeout) for 2 running jobs to finish; if not done by then, they are given back to the queue (nacked, counting the attempt)",
    ]);
    assert.ok(took >= 190 && took < 3_000, `stop took ${took} ms`);
    assert.deepEqual(report, { acked: 0, nacked: 0, leaseLost: 0, abandoned: 2 });
    assert.ok(reason instanceof DOMException);
    assert.equal(reason.message, "worker shut down before the job finished");
    assert.equal(stubbornSignal?.aborted, true);
    for (const { jobId } of [polite, stubborn]) {
      const info = await client.getJob(jobId);
      assert.equal(info.state, "ready");
      assert.equal(info.attempt, 1);
      assert.equal(info.lastReason, "worker shut down before the job finished");
    }
  });

  test("at most maxInFlight handlers run at once", async () => {
    const queue = freshQueue("concurrency");
    const n = 12;
    await client.enqueueBatch(Array.from({ length: n }, () => ({ queue, jobType: "t" })));
    let running = 0;
    let most = 0;
    let done = 0;
    const all = deferred();
    // The first handlers wait until three run at once: the worker must start a third while
    // two are still running, and never a fourth.
    const three = deferred();
    const worker = new Worker(client, { queues: [queue], maxInFlight: 3 }).handle("t", async () => {
      running += 1;
      most = Math.max(most, running);
      if (running === 3) three.resolve();
      await three.promise;
      running -= 1;
      if (++done === n) all.resolve();
    });
    const report = await runUntil(worker, all.promise);
    assert.equal(report.acked, n);
    assert.equal(most, 3, `${most} handlers at once`);
    const stats = await client.getQueueStats(queue);
    assert.deepEqual([stats.ready, stats.inFlight], [0, 0]);
  });

  test("stop() before run() does nothing, and a stopped worker can run again", async () => {
    const queue = freshQueue("rerun");
    const worker = new Worker(client, { queues: [queue] });
    await worker.stop();
    for (const round of [1, 2]) {
      await client.enqueue({ queue, jobType: "t" });
      const ran = deferred();
      worker.handle("t", async () => ran.resolve());
      const report = await runUntil(worker, ran.promise, `round ${round}`);
      assert.equal(report.acked, 1);
    }
  });

  test("stop() in the same tick as run() leases nothing", async () => {
    const queue = freshQueue("early-stop");
    const { jobId } = await client.enqueue({ queue, jobType: "t" });
    for (let i = 0; i < 3; i++) {
      const worker = new Worker(client, { queues: [queue], handleSignals: false });
      worker.handle("t", async () => {
        throw new Error("a stopped worker runs no handler");
      });
      const running = worker.run();
      await worker.stop();
      const report = await running;
      assert.deepEqual({ ...report }, { acked: 0, nacked: 0, leaseLost: 0, abandoned: 0 });
    }
    // Not leased and given back three times over: no attempt was spent.
    const info = await client.getJob(jobId);
    assert.equal(info.state, "ready");
    assert.equal(info.attempt, 0);
  });
});

describe("bad input", T, () => {
  test("without onError, a handler's unexpected error is logged to console.error; HandlerError is not", async () => {
    const queue = freshQueue("logged");
    await client.enqueue({ queue, jobType: "boom", maxAttempts: 1 });
    await client.enqueue({ queue, jobType: "intended", maxAttempts: 1 });
    const lines = /** @type {string[]} */ ([]);
    const original = console.error;
    console.error = (...args) => {
      lines.push(args.map((a) => (a instanceof Error ? `${a.name}: ${a.message}` : String(a))).join(" "));
    };
    try {
      const both = [deferred(), deferred()];
      const worker = new Worker(client, { queues: [queue] })
        .handle("boom", () => {
          both[0].resolve();
          throw new RangeError("out of range");
        })
        .handle("intended", () => {
          both[1].resolve();
          throw HandlerError.permanent("not for us");
        });
      const report = await runUntil(worker, Promise.all(both.map((d) => d.promise)));
      assert.equal(report.nacked, 2);
    } finally {
      console.error = original;
    }
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.match(lines[0], /handler of "boom" failed on job .* \(attempt 1\).*RangeError: out of range/);
  });

  test("an ack the server refuses is said on console.error, and counted as a lost lease", async () => {
    const queue = freshQueue("unsettled");
    const { jobId } = await client.enqueue({ queue, jobType: "t" });
    const lines = /** @type {string[]} */ ([]);
    const original = console.error;
    console.error = (...args) => {
      lines.push(args.map(String).join(" "));
    };
    let report;
    try {
      const handled = deferred();
      const worker = new Worker(client, { queues: [queue], handleSignals: false }).handle("t", async (job) => {
        // Settled behind the worker's back: its own ack finds the job gone.
        await client.ack(job.id, job.attempt);
        handled.resolve();
      });
      report = await runUntil(worker, handled.promise);
    } finally {
      console.error = original;
    }
    assert.equal(report.leaseLost, 1);
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.match(lines[0], new RegExp(`^sepp worker: job ${jobId} \\(attempt 1\\) could not be settled: .*not in flight`));
  });

  test("the constructor and HandlerError check their arguments", () => {
    const typeError = (/** @type {RegExp} */ re) => (/** @type {any} */ e) =>
      e instanceof TypeError && e.code === "ERR_INVALID_ARG_TYPE" && re.test(e.message);
    assert.throws(() => new Worker(/** @type {any} */ ({}), { queues: ["q"] }), typeError(/client must be a SeppClient/));
    assert.throws(() => new Worker(client, /** @type {any} */ (undefined)), typeError(/options/));
    assert.throws(() => new Worker(client, /** @type {any} */ ({ queues: ["q"], handleSignals: "yes" })), TypeError);
    assert.throws(() => new Worker(client, /** @type {any} */ ({ queues: ["q"], onError: "log" })), typeError(/onError/));
    const worker = new Worker(client, { queues: ["q"] });
    assert.throws(() => worker.handle(/** @type {any} */ (1), async () => {}), typeError(/jobType/));
    assert.throws(() => worker.handle("t", /** @type {any} */ ("nope")), typeError(/handler/));
    assert.throws(() => HandlerError.retryAfter(-5), RangeError);
    assert.throws(() => HandlerError.retryAfter(/** @type {any} */ ("5s")), TypeError);
    assert.throws(() => HandlerError.retry(/** @type {any} */ (42)), typeError(/reason/));
    assert.throws(() => new (/** @type {any} */ (HandlerError))(), TypeError);
    const e = HandlerError.retryAfter(1_500, "busy");
    assert.ok(e instanceof Error);
    assert.equal(e.name, "HandlerError");
    assert.equal(e.message, "retry after 1500 ms (busy)");
    assert.deepEqual(
      [e.kind, e.delayMs, e.reason, e.outcome],
      ["retryAfter", 1_500, "busy", { kind: "retryAfter", delayMs: 1_500, reason: "busy" }],
    );
    assert.equal(HandlerError.permanent().message, "permanent failure (no reason)");
    assert.deepEqual(HandlerError.retry().outcome, { kind: "retry" });
  });

  test("the constructor refuses bad engine options; run() refuses a second concurrent run", async () => {
    const invalid = (/** @type {RegExp} */ re) => (/** @type {any} */ e) =>
      e instanceof InvalidArgumentError && re.test(e.message);
    assert.throws(() => new Worker(client, { queues: [] }), invalid(/queues is empty/));
    assert.throws(() => new Worker(client, { queues: ["q", ""] }), invalid(/queues contains an empty name/));
    assert.throws(() => new Worker(client, { queues: ["q"], maxInFlight: 0 }), invalid(/^maxInFlight is 0: it must be at least 1$/));
    assert.throws(() => new Worker(client, { queues: ["q"], leaseDurationMs: 0 }), invalid(/^leaseDurationMs is 0: it must be positive$/));
    assert.throws(
      () => new Worker(client, { queues: ["q"], leaseDurationMs: 0.5 }),
      invalid(/^leaseDurationMs is 500µs: it must be at least 1 ms/),
    );
    assert.throws(() => new Worker(client, { queues: ["q"], leaseDurationMs: -1 }), invalid(/leaseDurationMs/));
    assert.throws(() => new Worker(client, { queues: ["q"], shutdownTimeoutMs: -1 }), invalid(/shutdownTimeoutMs/));
    assert.throws(() => new Worker(client, { queues: ["q"], handlerTimeoutMs: 0 }), invalid(/^handlerTimeoutMs is 0: it must be positive/));
    assert.throws(
      () => new Worker(client, { queues: ["q"], handlerTimeoutMs: 0.5 }),
      invalid(/^handlerTimeoutMs is 500µs: it must be at least 1 ms/),
    );
    assert.throws(
      () => new Worker(client, /** @type {any} */ ({ queues: "q" })),
      (/** @type {any} */ e) => e instanceof TypeError && /options\.queues/.test(e.message),
    );
    assert.throws(
      () => new Worker(client, /** @type {any} */ ({ queues: ["q"], maxInFlight: "4" })),
      (/** @type {any} */ e) => e instanceof TypeError && /maxInFlight/.test(e.message),
    );
    const worker = new Worker(client, { queues: [freshQueue("twice")] });
    const run = worker.run();
    await assert.rejects(worker.run(), /already running/);
    await worker.stop();
    assert.deepEqual(await run, { acked: 0, nacked: 0, leaseLost: 0, abandoned: 0 });
  });
});

describe("Engine", T, () => {
  test("next, settle, lost, done, waitIdle, shutdown, abandonAll and report", async () => {
    const queue = freshQueue("engine");
    const a = await client.enqueue({ queue, jobType: "t", payload: { data: Buffer.from("a"), encoding: "text/plain" } });
    const b = await client.enqueue({ queue, jobType: "t" });
    const engine = await Engine.start(client, { queues: [queue], maxInFlight: 2, workerId: "engine-test" });
    assert.equal(engine.isShutDown, false);
    const first = await engine.next();
    const second = await engine.next();
    assert.ok(first && second);
    assert.deepEqual(new Set([first.job.id, second.job.id]), new Set([a.jobId, b.jobId]));
    assert.ok(first.expiresAt instanceof Date && first.expiresAt.getTime() > Date.now());
    assert.equal(first.isLost(), false);
    assert.equal(engine.inFlight, 2);
    assert.equal((await client.getJob(first.job.id)).workerId, "engine-test");
    // Every slot is taken, so the poller is not reserving: shutting down cancels no reserve (a
    // cancelled long poll may still take a job the server makes ready before it reads the
    // cancel, such as the one abandoned below; docs/lifecycle.md).
    engine.shutdown();
    assert.equal(engine.isShutDown, true);
    assert.equal(await engine.next(), null);

    await assert.rejects(
      engine.settle(first.job.id, first.job.attempt, /** @type {any} */ ({ kind: "later" })),
      (/** @type {any} */ e) => e instanceof TypeError && /outcome\.kind/.test(e.message),
    );
    await assert.rejects(
      engine.settle(first.job.id, first.job.attempt, { kind: "retryAfter", delayMs: -1 }),
      InvalidArgumentError,
    );
    // Settling resolves lost() with false: nothing keeps the process alive afterwards.
    const lost = first.lost();
    await engine.settle(first.job.id, first.job.attempt, { kind: "success" });
    assert.equal(await lost, false);
    assert.deepEqual(await first.done(), { kind: "settled", reason: "the job was settled" });
    assert.equal(engine.inFlight, 1);
    assert.equal(await engine.waitIdle(50), false);
    // Settled already: refused without a call (also under the deprecated name).
    await assert.rejects(engine.complete(first.job.id, first.job.attempt, { kind: "success" }), JobNotInFlightError);

    const secondLost = second.lost();
    assert.equal(await engine.abandonAll("test over"), 1);
    assert.equal(await secondLost, false);
    assert.equal((await second.done()).kind, "abandoned");
    assert.equal(await engine.waitIdle(1_000), true);
    assert.deepEqual(engine.report, { acked: 1, nacked: 0, leaseLost: 0, abandoned: 1 });
    const info = await client.getJob(second.job.id);
    assert.equal(info.state, "ready");
    assert.equal(info.lastReason, "test over");
    // Settling it now is refused: it is not in flight any more.
    await assert.rejects(engine.settle(second.job.id, second.job.attempt, { kind: "success" }), JobNotInFlightError);
  });

  test("Engine.start checks its arguments", async () => {
    await assert.rejects(Engine.start(/** @type {any} */ ({}), { queues: ["q"] }), TypeError);
    await assert.rejects(Engine.start(client, /** @type {any} */ ({ queues: ["q"], autoExtend: "no" })), (e) =>
      e instanceof TypeError && /options\.autoExtend must be a boolean/.test(e.message),
    );
    await assert.rejects(Engine.start(client, { queues: ["q"], waitTimeoutMs: Number.NaN }), InvalidArgumentError);
  });
});
