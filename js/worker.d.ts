// Types of worker.js: `Worker`, `HandlerError` and what handlers get.
import type { EngineReport, Job, Outcome, SeppClient } from "./index.js";

/** Settings of a `Worker`. Only `queues` is required. */
export interface WorkerOptions {
  /** Queues to reserve from, in priority order; at least one. */
  queues: string[];
  /**
   * Lease asked for per job, in milliseconds; positive. The server may clamp it to the
   * queue's `max_lease_duration_ms`.
   * @default 30000
   */
  leaseDurationMs?: number;
  /**
   * Most jobs handled at once; at least 1. Each reserve asks for as many jobs as there are
   * free slots.
   * @default 10
   */
  maxInFlight?: number;
  /**
   * Extend each job's lease while its handler runs (when a third of it is left). Without it,
   * a handler that runs past its lease loses the job: when the lease runs out its `signal`
   * is aborted and the job is counted as `leaseLost`; the server's lease expiry decides
   * what becomes of it.
   * @default true
   */
  autoExtend?: boolean;
  /**
   * Long-poll wait of each reserve, in milliseconds (the server clamps it to its
   * `max_wait_timeout_ms`).
   * @default 5000
   */
  waitTimeoutMs?: number;
  /**
   * After a stop is requested, how long running handlers may take to finish, in
   * milliseconds. Past it their `signal` is aborted and their jobs are nacked with the
   * queue's retry policy and the reason `worker shut down before the job finished`.
   * @default 30000
   */
  shutdownTimeoutMs?: number;
  /** A label sent with each reserve, shown by job inspection (`JobInfo.workerId`). */
  workerId?: string;
  /**
   * Stop gracefully on SIGTERM and SIGINT while `run()` runs. The listeners are removed once
   * shutdown begins, so a second signal ends the process the usual way.
   * @default true
   */
  handleSignals?: boolean;
  /**
   * Called when a handler throws anything but a `HandlerError` (which is an intended outcome),
   * with the thrown value and the job, before the job is nacked with the queue's retry policy.
   * A hook that throws is reported with `process.emitWarning` and the worker goes on.
   * @default logs one line and the error to `console.error`
   */
  onError?: (error: unknown, job: Job) => void;
}

/** What a handler gets besides the job. */
export interface JobContext {
  /**
   * Aborted when the engine lets go of the job before the handler finished: its lease was
   * lost (someone else may now process the job), it ran past `handlerTimeoutMs`, or the
   * shutdown grace period ended; `signal.reason` is a `DOMException` named `AbortError` saying
   * which. Pass it to `fetch`, timers and streams, or check `signal.aborted`: the worker does
   * not wait for an aborted handler, and ignores its result.
   */
  readonly signal: AbortSignal;
  /** The lease's current expiry, moved by auto-extension; `null` when the server gave none. */
  readonly leaseExpiresAt: Date | null;
}

/**
 * Processes one job. Resolving acks it; throwing a `HandlerError` nacks it as that error
 * says; throwing anything else nacks it with the queue's retry policy, the error's message as
 * the reason.
 */
export type Handler = (job: Job, context: JobContext) => Promise<void> | void;

/**
 * What a run of a worker did: the counts of the core's engine (`acked`, `nacked`, `leaseLost`,
 * `abandoned`; see `EngineReport`), with the names of earlier releases.
 */
export interface WorkerReport extends EngineReport {
  /** @deprecated Renamed `acked` (not enumerable). */
  readonly succeeded: number;
  /** @deprecated Renamed `nacked` (not enumerable). */
  readonly failed: number;
}

/**
 * Why a handler failed, and what to do with the job: throw one from a handler. Each retry
 * dead-letters the job on its last attempt (`maxAttempts`).
 *
 * @example
 * worker.handle("receipt", async (job) => {
 *   if (!job.payload) throw HandlerError.permanent("no payload");
 *   const res = await fetch(url);
 *   if (res.status === 429) throw HandlerError.retryAfter(60_000, "rate limited");
 *   if (!res.ok) throw HandlerError.retry(`HTTP ${res.status}`);
 * });
 */
export declare class HandlerError extends Error {
  private constructor(token: symbol, outcome: Exclude<Outcome, { kind: "success" }>);
  /**
   * Retry with the queue's policy (`retry_delay_ms`, `retry_backoff`).
   * @param reason kept as the job's last reason (`JobInfo.lastReason`, dead letters)
   */
  static retry(reason?: string): HandlerError;
  /**
   * Retry after `delayMs` milliseconds (clamped by the server to its schedule horizon).
   * Throws a `RangeError` for a negative or non-finite `delayMs`.
   */
  static retryAfter(delayMs: number, reason?: string): HandlerError;
  /** Do not retry: dead-letter the job now. */
  static permanent(reason?: string): HandlerError;
  readonly name: "HandlerError";
  /** Which of the three. */
  readonly kind: "retry" | "retryAfter" | "permanent";
  /** The delay of `retryAfter`, in milliseconds; `undefined` for the others. */
  readonly delayMs: number | undefined;
  /** The reason given, if any. */
  readonly reason: string | undefined;
  /** The outcome the worker reports to the engine. */
  readonly outcome: Exclude<Outcome, { kind: "success" }>;
}

/**
 * Processes jobs with handlers registered per job type, at most `maxInFlight` at once, over
 * the core's engine, which holds every rule of a worker (the same as in Rust and Python): it
 * reserves, extends leases, settles jobs, nacks the job types without a handler, frees the
 * slot of a lost lease without a call, nacks jobs past `handlerTimeoutMs`, and drains at
 * shutdown. The worker only runs the handlers.
 *
 * A handler that resolves acks its job; see `Handler` and `HandlerError` for failures. A job
 * type without a handler (and no `fallback`) is nacked with the queue's retry policy; the
 * worker goes on either way. If the engine lets go of a job while its handler runs (lease
 * lost, handler timeout, end of the grace period), the handler's `signal` is aborted and the
 * worker moves on.
 *
 * `run()` runs until `stop()` is called or the process gets SIGTERM or SIGINT; then it stops
 * reserving (jobs reserved but not started are given back at once), lets running handlers
 * finish within `shutdownTimeoutMs`, aborts the others and nacks their jobs, and resolves.
 *
 * @example
 * const worker = new Worker(client, { queues: ["emails"], maxInFlight: 8 });
 * worker.handle("receipt", async (job, { signal }) => {
 *   await sendReceipt(job.payload, { signal });
 * });
 * const report = await worker.run(); // until SIGTERM or worker.stop()
 */
export declare class Worker {
  /**
   * A worker reserving through `client` (which stays usable for other calls). Nothing is
   * sent before `run()`. Throws a `TypeError` when `client` is not a `SeppClient` or an
   * option has the wrong type, and an `InvalidArgumentError` for no queues, an empty queue
   * name, a lease that is not positive, `maxInFlight` 0, `handlerTimeoutMs` 0 or a negative
   * duration (the same rule as `Engine.start`, from the Rust core).
   */
  constructor(client: SeppClient, options: WorkerOptions);
  /** Handles jobs of `jobType` with `handler` (replacing any earlier one). Returns the worker. */
  handle(jobType: string, handler: Handler): this;
  /** Handles every job type without a handler of its own. Returns the worker. */
  fallback(handler: Handler): this;
  /**
   * Processes jobs until `stop()`, SIGTERM or SIGINT, then shuts down gracefully; resolves to
   * what it did. May run again once it has resolved.
   *
   * Rejects with an `Error` with code `ERR_SEPP_CLIENT_CLOSED` for a closed client, and an
   * `Error` when the worker is already running (its options were checked when it was made).
   * When the server refuses to reserve for good (`UnauthenticatedError`,
   * `PermissionDeniedError` for a key without the worker role, `FailedPreconditionError` for a
   * queue strict mode does not know, ...), it stops reserving at once, lets the running
   * handlers finish as in a stop, then rejects with that error.
   */
  run(): Promise<WorkerReport>;
  /**
   * Begins the graceful shutdown of the current run; resolves once `run()` has settled (at
   * most `shutdownTimeoutMs` plus one nack round trip later). Does nothing when not running.
   * Called in the same tick as `run()`, the run returns without reserving (a job leased only
   * to be given back would spend an attempt). Do not await it from a handler: the run waits for that handler (up to
   * `shutdownTimeoutMs`).
   */
  stop(): Promise<void>;
}
