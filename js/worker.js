// `Worker` and `HandlerError`: async handlers on leased jobs, over the core's engine (engine.js).
//
// This mirrors the Rust Worker (core/src/worker.rs). The engine does the queue work: it reserves
// in batches sized to the free slots (so at most `maxInFlight` jobs are handed out at once),
// extends leases, backs off while the server fails, settles jobs, and releases what it reserved
// during shutdown. This file is the host side only: pick a handler by job type, run it as a
// Promise, turn its result into an outcome, abort it when its lease is lost, and run the
// shutdown sequence (stop reserving, grace period, abort, abandon). Documentation: worker.d.ts.

import { nativeClient } from "./bridge.js";
import { Engine } from "./engine.js";
import { AttemptMismatchError, JobNotInFlightError } from "./errors.js";

/** Guards the constructor of HandlerError: use its static methods. */
const fromFactory = Symbol("HandlerError");

/** Why the jobs still running after the grace period were nacked (`JobInfo.lastReason`). */
const SHUTDOWN_REASON = "worker shut down before the job finished";

/** @typedef {import("./index.js").Outcome} Outcome */
/** @typedef {Exclude<Outcome, { kind: "success" }>} Failure */
/** @typedef {import("./worker.js").WorkerReport} WorkerReport */
/** @typedef {"succeeded" | "failed" | "leaseLost" | "abandoned"} Done */

/**
 * A `TypeError` with Node's code for a bad argument, as the native module makes them.
 * @param {string} message
 */
function argumentError(message) {
  return Object.assign(new TypeError(message), { code: "ERR_INVALID_ARG_TYPE" });
}

/**
 * @param {unknown} reason
 * @param {string} name
 */
function checkReason(reason, name) {
  if (reason !== undefined && typeof reason !== "string") {
    throw argumentError(`${name} must be a string, got ${typeof reason}`);
  }
}

/**
 * @param {unknown} ms
 * @param {string} name
 */
function checkMillis(ms, name) {
  if (typeof ms !== "number") throw argumentError(`${name} must be a number, got ${typeof ms}`);
  if (!Number.isFinite(ms) || ms < 0) {
    throw new RangeError(`${name} is ${ms}: expected a finite, non-negative number of milliseconds`);
  }
}

export class HandlerError extends Error {
  /**
   * Use `HandlerError.retry`, `.retryAfter` or `.permanent`.
   * @param {symbol} token
   * @param {Failure} outcome
   */
  constructor(token, outcome) {
    if (token !== fromFactory) {
      throw new TypeError("use HandlerError.retry(), .retryAfter(ms) or .permanent() to create a HandlerError");
    }
    const why = outcome.reason ?? "no reason";
    super(
      outcome.kind === "retry"
        ? `retry (${why})`
        : outcome.kind === "retryAfter"
          ? `retry after ${outcome.delayMs} ms (${why})`
          : `permanent failure (${why})`,
    );
    this.name = "HandlerError";
    /** @readonly */
    this.kind = outcome.kind;
    /** @readonly */
    this.delayMs = outcome.kind === "retryAfter" ? outcome.delayMs : undefined;
    /** @readonly */
    this.reason = outcome.reason;
    /** @readonly @type {Failure} */
    this.outcome = Object.freeze(outcome);
  }

  /** @param {string} [reason] */
  static retry(reason) {
    checkReason(reason, "reason");
    return new HandlerError(fromFactory, reason === undefined ? { kind: "retry" } : { kind: "retry", reason });
  }

  /**
   * @param {number} delayMs
   * @param {string} [reason]
   */
  static retryAfter(delayMs, reason) {
    checkMillis(delayMs, "delayMs");
    checkReason(reason, "reason");
    return new HandlerError(
      fromFactory,
      reason === undefined ? { kind: "retryAfter", delayMs } : { kind: "retryAfter", delayMs, reason },
    );
  }

  /** @param {string} [reason] */
  static permanent(reason) {
    checkReason(reason, "reason");
    return new HandlerError(
      fromFactory,
      reason === undefined ? { kind: "permanent" } : { kind: "permanent", reason },
    );
  }
}

/**
 * The outcome for what a handler threw: a `HandlerError`'s own, else a retry with the queue's
 * policy, the error as the reason (as the Rust worker does with any `Error`).
 * @param {unknown} err
 * @returns {Failure}
 */
function outcomeOf(err) {
  if (err instanceof HandlerError) return err.outcome;
  const reason = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  return { kind: "retry", reason };
}

/**
 * The default `onError`: one line on standard error with the job, then the error (its stack
 * when it has one).
 * @param {unknown} err
 * @param {import("./index.js").Job} job
 */
function logHandlerError(err, job) {
  console.error(
    `sepp worker: the handler of ${JSON.stringify(job.jobType)} failed on job ${job.id} (attempt ${job.attempt}); it will be retried or dead-lettered by the queue's policy:`,
    err,
  );
}

/** @type {Outcome} */
const SUCCESS = Object.freeze({ kind: "success" });
/** The lease was lost while the handler ran. */
const LOST = Symbol("lost");
/** The job was abandoned (end of the grace period) while the handler ran. */
const ENDED = Symbol("ended");

/**
 * `promise` settled within `ms` milliseconds? The timer is cleared either way, so it never
 * keeps the process alive.
 * @param {Promise<unknown>} promise
 * @param {number} ms
 * @returns {Promise<boolean>}
 */
function settlesWithin(promise, ms) {
  /** @type {NodeJS.Timeout | undefined} */
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(resolve, ms, false);
  });
  return Promise.race([promise.then(() => true), timeout]).finally(() => clearTimeout(timer));
}

/** One job being handled. */
class Task {
  /** Aborted when the lease is lost or the grace period ends; the handler's `signal`. */
  controller = new AbortController();
  /** Set once the grace period ended: the job is the engine's to nack, not this task's. */
  abandoned = false;

  /** @param {(task: Task) => Promise<Done>} run handles the job; never rejects */
  constructor(run) {
    /** @type {Promise<Done>} */
    this.done = run(this);
  }

  /** The grace period is over: abort the handler; `abandonAll` nacks the job. */
  abandon() {
    this.abandoned = true;
    this.controller.abort(new DOMException(SHUTDOWN_REASON, "AbortError"));
  }
}

export class Worker {
  /** @type {import("./sepp.js").SeppClient} */
  #client;
  /** @type {import("./index.js").EngineOptions} */
  #engineOptions;
  /** @type {number} */
  #shutdownTimeoutMs;
  /** @type {boolean} */
  #handleSignals;
  /** @type {(error: unknown, job: import("./index.js").Job) => void} */
  #onError;
  /** @type {Map<string, import("./worker.js").Handler>} */
  #handlers = new Map();
  /** @type {import("./worker.js").Handler | undefined} */
  #fallback;
  /**
   * The current run: `requestStop` begins its shutdown, `finished` resolves when `run()` has
   * settled. Set by `run`, cleared when it ends.
   * @type {{ requestStop: () => void, finished: Promise<void> } | undefined}
   */
  #running;

  /**
   * @param {import("./sepp.js").SeppClient} client
   * @param {import("./worker.js").WorkerOptions} options
   */
  constructor(client, options) {
    nativeClient(client, "client");
    if (typeof options !== "object" || options === null || Array.isArray(options)) {
      throw argumentError("options must be an object with at least `queues`");
    }
    const { shutdownTimeoutMs = 30_000, handleSignals = true, onError = logHandlerError } = options;
    checkMillis(shutdownTimeoutMs, "options.shutdownTimeoutMs");
    if (typeof handleSignals !== "boolean") {
      throw argumentError(`options.handleSignals must be a boolean, got ${typeof handleSignals}`);
    }
    if (typeof onError !== "function") {
      throw argumentError(`options.onError must be a function, got ${typeof onError}`);
    }
    this.#onError = onError;
    this.#client = client;
    // Only the engine's fields; the engine checks them (a TypeError or InvalidArgumentError from run()).
    const { queues, leaseDurationMs, maxInFlight, autoExtend, waitTimeoutMs, workerId } = options;
    this.#engineOptions = { queues, leaseDurationMs, maxInFlight, autoExtend, waitTimeoutMs, workerId };
    this.#shutdownTimeoutMs = shutdownTimeoutMs;
    this.#handleSignals = handleSignals;
  }

  /**
   * @param {string} jobType
   * @param {import("./worker.js").Handler} handler
   */
  handle(jobType, handler) {
    if (typeof jobType !== "string") throw argumentError(`jobType must be a string, got ${typeof jobType}`);
    if (typeof handler !== "function") throw argumentError(`handler must be a function, got ${typeof handler}`);
    this.#handlers.set(jobType, handler);
    return this;
  }

  /** @param {import("./worker.js").Handler} handler */
  fallback(handler) {
    if (typeof handler !== "function") throw argumentError(`handler must be a function, got ${typeof handler}`);
    this.#fallback = handler;
    return this;
  }

  /** @returns {Promise<WorkerReport>} */
  async run() {
    if (this.#running) throw new Error("the worker is already running: await stop() before running it again");
    /** @type {() => void} */
    let requestStop = () => {};
    /** Resolves when a stop is requested (stop(), SIGTERM, SIGINT). */
    const stopping = new Promise((resolve) => {
      requestStop = () => resolve(undefined);
    });
    /** @type {() => void} */
    let finish = () => {};
    const finished = new Promise((resolve) => {
      finish = () => resolve(undefined);
    });
    this.#running = { requestStop, finished };
    const onSignal = () => requestStop();
    if (this.#handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    // Once shutdown begins the listeners go, so a second signal ends the process as usual.
    const releaseSignals = () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    };
    try {
      const engine = await Engine.start(this.#client, this.#engineOptions);
      return await this.#drive(engine, stopping, releaseSignals);
    } finally {
      releaseSignals();
      this.#running = undefined;
      finish();
    }
  }

  /** @returns {Promise<void>} */
  stop() {
    const running = this.#running;
    if (running === undefined) return Promise.resolve();
    running.requestStop();
    return running.finished;
  }

  /**
   * Hands each job to its handler until the engine shuts down, then runs the grace period.
   * @param {Engine} engine
   * @param {Promise<unknown>} stopping
   * @param {() => void} releaseSignals
   * @returns {Promise<WorkerReport>}
   */
  async #drive(engine, stopping, releaseSignals) {
    /** @type {WorkerReport} */
    const report = { succeeded: 0, failed: 0, leaseLost: 0, abandoned: 0 };
    /** Tasks not yet done; each removes itself. @type {Set<Task>} */
    const tasks = new Set();
    void stopping.then(() => engine.shutdown());
    try {
      for (;;) {
        // At most `maxInFlight` jobs are handed out and not completed: the engine waits here.
        const lease = await engine.next();
        if (lease === null) break;
        const task = new Task((t) => this.#runOne(engine, lease, t));
        tasks.add(task);
        void task.done.then((done) => {
          tasks.delete(task);
          if (done !== "abandoned") report[done] += 1;
        });
      }
    } finally {
      engine.shutdown();
      releaseSignals();
      const inTime = await settlesWithin(
        Promise.all([...tasks].map((t) => t.done)),
        this.#shutdownTimeoutMs,
      );
      if (!inTime) for (const task of tasks) task.abandon();
      report.abandoned = await engine.abandonAll(SHUTDOWN_REASON);
    }
    // A copy: a task abandoned above may still end later.
    return { ...report };
  }

  /**
   * Hands a handler's unexpected error to `onError`; a throwing hook is reported as a warning
   * and does not stop the worker.
   * @param {unknown} err
   * @param {import("./index.js").Job} job
   */
  #reportError(err, job) {
    try {
      this.#onError(err, job);
    } catch (hookErr) {
      process.emitWarning(
        `the worker's onError hook threw: ${hookErr instanceof Error ? hookErr.message : String(hookErr)}`,
        { code: "SEPP_ON_ERROR_THREW" },
      );
    }
  }

  /**
   * Runs one handler: settles the job with its outcome, or aborts the handler when the lease
   * is lost. Never rejects.
   * @param {Engine} engine
   * @param {import("./index.js").Lease} lease
   * @param {Task} task
   * @returns {Promise<Done>}
   */
  async #runOne(engine, lease, task) {
    const job = lease.job;
    const handler = this.#handlers.get(job.jobType) ?? this.#fallback;
    /** @type {Outcome} */
    let outcome;
    if (handler === undefined) {
      outcome = { kind: "retry", reason: `no handler for job type ${JSON.stringify(job.jobType)}` };
    } else {
      /** @type {import("./worker.js").JobContext} */
      const context = {
        signal: task.controller.signal,
        get leaseExpiresAt() {
          return lease.expiresAt;
        },
      };
      const ran = (async () => handler(job, context))().then(
        () => SUCCESS,
        (err) => {
          if (!(err instanceof HandlerError)) this.#reportError(err, job);
          return outcomeOf(err);
        },
      );
      // `lost()` resolves `false` only once the job is settled, which here means abandoned.
      const ended = lease.lost().then((lost) => (lost ? LOST : ENDED));
      const first = await Promise.race([ran, ended]);
      if (first === ENDED) return "abandoned";
      if (first === LOST) {
        task.controller.abort(
          new DOMException(
            `the lease of job ${job.id} (attempt ${job.attempt}) was lost: it will be delivered again`,
            "AbortError",
          ),
        );
        // The job is someone else's now: this only frees the slot (settling fails anyway).
        if (!task.abandoned) await engine.complete(job.id, job.attempt, { kind: "retry" }).catch(() => {});
        return "leaseLost";
      }
      outcome = first;
    }
    if (task.abandoned) return "abandoned";
    try {
      await engine.complete(job.id, job.attempt, outcome);
    } catch (err) {
      if (err instanceof JobNotInFlightError || err instanceof AttemptMismatchError) return "leaseLost";
      process.emitWarning(
        `could not settle job ${job.id} (attempt ${job.attempt}): ${err instanceof Error ? err.message : String(err)}; its lease will run out and it will be delivered again`,
        { code: "SEPP_SETTLE_FAILED" },
      );
    }
    return outcome.kind === "success" ? "succeeded" : "failed";
  }
}
