// `Worker` and `HandlerError`: async handlers on leased jobs, over the core's engine (engine.js).
//
// The worker only runs handlers, as the Rust and Python workers do. The engine holds the whole
// worker policy (core/src/engine.rs): it reserves in batches sized to the free slots (so at
// most `maxInFlight` jobs are handed out at once), extends leases, frees the slot of a lost
// lease, nacks the job types without a handler and the handlers past `handlerTimeoutMs`,
// settles jobs, drains at shutdown and counts. This file runs each job's handler as a Promise,
// aborts it when the engine lets go of the job first (`Lease.done()`), and reports how it ended
// as an outcome. Documentation: worker.d.ts.

import { fromNative, native, nativeClient } from "./bridge.js";
import { Engine } from "./engine.js";
import { inHandlerSpan } from "./tracing.js";

/** Guards the constructor of HandlerError: use its static methods. */
const fromFactory = Symbol("HandlerError");

/** @typedef {import("./index.js").Outcome} Outcome */
/** @typedef {Exclude<Outcome, { kind: "success" }>} Failure */
/** @typedef {import("./worker.js").WorkerReport} WorkerReport */

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
 * policy, the error's message as the reason (as in Rust and Python).
 * @param {unknown} err
 * @returns {Failure}
 */
function outcomeOf(err) {
  if (err instanceof HandlerError) return err.outcome;
  const reason = err instanceof Error ? err.message || err.name : String(err);
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

/**
 * The report of a run, with the names of earlier releases (`succeeded`, `failed`) as
 * deprecated, non-enumerable getters.
 * @param {import("./index.js").WorkerReport} counts
 * @returns {WorkerReport}
 */
function withOldNames(counts) {
  const report = { ...counts };
  Object.defineProperties(report, {
    succeeded: { get: () => report.acked, enumerable: false },
    failed: { get: () => report.nacked, enumerable: false },
  });
  return /** @type {WorkerReport} */ (report);
}

export class Worker {
  /** @type {import("./sepp.js").SeppClient} */
  #client;
  /** @type {import("./index.js").EngineOptions} */
  #engineOptions;
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
    const { handleSignals = true, onError = logHandlerError } = options;
    if (typeof handleSignals !== "boolean") {
      throw argumentError(`options.handleSignals must be a boolean, got ${typeof handleSignals}`);
    }
    if (typeof onError !== "function") {
      throw argumentError(`options.onError must be a function, got ${typeof onError}`);
    }
    this.#onError = onError;
    this.#client = client;
    // Only the engine's fields, checked now by the engine's own rule (a TypeError or an
    // InvalidArgumentError from here, not from run()).
    const { queues, leaseDurationMs, maxInFlight, autoExtend, waitTimeoutMs, workerId } = options;
    const { handlerTimeoutMs, shutdownTimeoutMs } = options;
    this.#engineOptions = {
      queues,
      leaseDurationMs,
      maxInFlight,
      autoExtend,
      waitTimeoutMs,
      workerId,
      handlerTimeoutMs,
      shutdownTimeoutMs,
    };
    try {
      native.Engine.checkOptions(this.#engineOptions);
    } catch (err) {
      throw fromNative(err);
    }
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
    let stopRequested = false;
    /** Resolves when a stop is requested (stop(), SIGTERM, SIGINT). */
    const stopping = new Promise((resolve) => {
      requestStop = () => {
        stopRequested = true;
        resolve(undefined);
      };
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
      // A stop() in the same tick as run() starts no engine: it would lease jobs only to give
      // them back, each at the cost of an attempt.
      await undefined;
      if (stopRequested) return withOldNames({ acked: 0, nacked: 0, leaseLost: 0, abandoned: 0 });
      // The engine nacks the job types nobody handles (all are handled with a fallback).
      const jobTypes = this.#fallback === undefined ? [...this.#handlers.keys()] : undefined;
      const engine = await Engine.start(this.#client, { ...this.#engineOptions, jobTypes });
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
   * Hands each job to its handler until the engine shuts down, then drains the engine.
   * @param {Engine} engine
   * @param {Promise<unknown>} stopping
   * @param {() => void} releaseSignals
   * @returns {Promise<WorkerReport>}
   */
  async #drive(engine, stopping, releaseSignals) {
    /** Jobs being handled; each removes itself. @type {Set<Promise<void>>} */
    const running = new Set();
    void stopping.then(() => engine.shutdown());
    try {
      for (;;) {
        // At most `maxInFlight` jobs are handed out and not settled: the engine waits here.
        const lease = await engine.next();
        if (lease === null) break;
        const handling = this.#runOne(engine, lease);
        running.add(handling);
        void handling.then(() => running.delete(handling));
      }
    } finally {
      releaseSignals();
      const notice = engine.stopNotice();
      if (notice !== null) console.error(notice);
      // Running handlers get the engine's shutdownTimeoutMs; the engine nacks the rest, and
      // their `done()` resolves, so every `#runOne` ends (an aborted handler is not awaited).
      await engine.drain();
      await Promise.all(running);
    }
    const failure = engine.failure();
    if (failure !== null) throw failure;
    return withOldNames(engine.report);
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
   * Runs one handler and reports how it ended; aborts it when the engine lets go of the job
   * first (lease lost, handler timeout, shutdown). Never rejects.
   * @param {Engine} engine
   * @param {import("./index.js").Lease} lease
   * @returns {Promise<void>}
   */
  async #runOne(engine, lease) {
    const job = lease.job;
    const handler = this.#handlers.get(job.jobType) ?? this.#fallback;
    // Not handed out: the engine nacks the job types without a handler.
    if (handler === undefined) return;
    const controller = new AbortController();
    /** @type {import("./worker.js").JobContext} */
    const context = {
      signal: controller.signal,
      get leaseExpiresAt() {
        return lease.expiresAt;
      },
    };
    const ended = lease.done().then((end) => ({ end }));
    // Inside the job's sepp.handle span when OpenTelemetry's API is installed (tracing.js).
    const ran = inHandlerSpan(
      lease,
      () =>
        (async () => handler(job, context))().then(
          () => SUCCESS,
          (err) => {
            // A handler that throws after the engine let go of its job (most often the
            // AbortError of its own signal) reports nothing: the job's end is already decided.
            if (!(err instanceof HandlerError) && !controller.signal.aborted) this.#reportError(err, job);
            return outcomeOf(err);
          },
        ),
      ended,
    );
    const first = await Promise.race([ran, ended]);
    if ("end" in first) {
      // The engine let go first and did what the job needs: stop the handler.
      controller.abort(new DOMException(first.end.reason, "AbortError"));
      return;
    }
    // Counted by the engine whatever happens; a lost lease leaves the job to the server. Said
    // on standard error, as the Python worker logs it.
    await engine.settle(job.id, job.attempt, first).catch((/** @type {unknown} */ err) => {
      const why = err instanceof Error ? err.message : String(err);
      console.error(`sepp worker: job ${job.id} (attempt ${job.attempt}) could not be settled: ${why}`);
    });
  }
}
