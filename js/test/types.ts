// A file that only type-checks (`tsc -p tsconfig.json`, never run): right usage compiles,
// each wrong usage is marked with @ts-expect-error, so tsc fails if the types accept it.

import {
  type AtomicResult,
  type CustomValue,
  Engine,
  type EngineOptions,
  type EngineReport,
  type LeaseEnd,
  HandlerError,
  type Handler,
  type JobContext,
  type Lease,
  type Outcome,
  Worker,
  type WorkerOptions,
  type WorkerReport,
  type DeadLetterRecord,
  type EnqueueAck,
  type EnqueueRequest,
  type EnqueueResult,
  type ErrorCode,
  IdempotencyKeyTooLongError,
  type Job,
  type JobInfo,
  type JobState,
  type KeyRecord,
  type QueueStats,
  QueueFullError,
  JobRejectedError,
  SeppClient,
  SeppError,
  type ServerInfo,
  errorClasses,
  errorCodes,
} from "sepp";

export async function rightUsage(): Promise<void> {
  const client: SeppClient = await SeppClient.connect("http://127.0.0.1:50051", {
    apiKey: "secret",
    tls: { caPem: "-----BEGIN CERTIFICATE-----", domain: "sepp.internal" },
    rpcTimeoutMs: null,
    retryPolicy: { maxRetries: 2, firstRetryDelayMs: 50 },
    coalesce: true,
    maxBatchesInFlight: 2,
  });

  const request: EnqueueRequest = {
    queue: "emails",
    jobType: "welcome",
    payload: { data: Buffer.from("{}"), encoding: "application/json" },
    idempotencyKey: "user-42",
    priority: 5,
    maxAttempts: 3,
    custom: { tenant: "acme", retries: 2, ratio: 0.5, big: 2n ** 60n, vip: true },
    traceContext: { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" },
    scheduledAt: new Date(),
  };
  const ack: EnqueueAck = await client.enqueue(request);
  const id: string = ack.jobId;
  const dedup: boolean = ack.deduplicated;

  const results: EnqueueResult[] = await client.enqueueBatch([request, request]);
  for (const r of results) {
    if (r.status === "enqueued") {
      const jobId: string = r.jobId;
      void jobId;
    } else {
      const error: SeppError = r.error;
      const code: ErrorCode = error.code;
      void code;
    }
  }
  const atomic: AtomicResult = await client.enqueueAtomic([request]);
  if (atomic.status === "committed") {
    const acks: EnqueueAck[] = atomic.acks;
    void acks;
  } else {
    const index: number | undefined = atomic.failures[0]?.index;
    void index;
  }

  const jobs: Job[] = await client.reserve({
    queues: ["emails"],
    leaseDurationMs: 30_000,
    waitTimeoutMs: 5_000,
    maxJobs: 10,
    workerId: "w-1",
  });
  for (const job of jobs) {
    const data: Uint8Array | undefined = job.payload?.data;
    const expires: Date | undefined = job.leaseExpiresAt;
    const custom: string | number | bigint | boolean | undefined = job.custom["tenant"];
    void data, expires, custom;
    const until: Date = await client.extend(job.id, job.attempt, 60_000);
    void until;
    const acked: void = await client.ack(job.id, job.attempt);
    void acked;
    const dead: boolean = await client.nack(job.id, job.attempt, { retry: { delayMs: 1_000 } });
    await client.nack(job.id, job.attempt, { retry: "deadLetter", reason: "bad input" });
    await client.nack(job.id, job.attempt);
    void dead;
  }
  const records: DeadLetterRecord[] = await client.drainDeadLetters({ queue: "emails", max: 10 });
  const cause: "unspecified" | "attemptsExhausted" | "rejected" | "leaseExpired" | "admin" | undefined =
    records[0]?.cause;
  const jobInfo: JobInfo = await client.getJob("job-id");
  const state: JobState = jobInfo.state;
  const carried: [Uint8Array | undefined, CustomValue | undefined, string | undefined] = [
    jobInfo.payload?.data,
    jobInfo.custom["tenant"],
    jobInfo.traceContext?.traceparent,
  ];
  const key: KeyRecord | null = await client.lookupIdempotencyKey("emails", "user-42");
  const page = await client.listDeadLetters({ queue: "emails", pageSize: 50 });
  const next: string | undefined = page.nextPageToken;
  const requeued: string[] = await client.requeueDeadLetters({ jobIds: ["a", "b"] });
  const deleted: string[] = await client.deleteDeadLetters({ queue: "emails", max: 10 });
  await client.pauseQueue("emails");
  await client.resumeQueue("emails");
  const stats: QueueStats = await client.getQueueStats("emails");
  void state, carried, key, next, requeued, deleted, stats;
  const info: ServerInfo = await client.getServerInfo();
  const limit: number = info.maxIdempotencyKeyBytes;
  const horizon: number | undefined = info.maxScheduleHorizonMs;
  client.close();
  void id, dedup, cause, limit, horizon;

  try {
    await client.enqueue({ queue: "q", jobType: "t", idempotencyKey: "k".repeat(257) });
  } catch (e) {
    if (e instanceof IdempotencyKeyTooLongError) {
      const bytes: number = e.limit + e.actual;
      const code: "IDEMPOTENCY_KEY_TOO_LONG" = e.code;
      const rejection: JobRejectedError = e;
      void bytes, code, rejection;
    } else if (e instanceof QueueFullError) {
      const queue: string = e.queue;
      const retryable: boolean = e.retryable;
      void queue, retryable;
    }
  }

  const codes: ErrorCode[] = errorCodes();
  const byCode: typeof SeppError = errorClasses.JOB_NOT_IN_FLIGHT;
  const all: Record<ErrorCode, typeof SeppError> = errorClasses;
  void codes, byCode, all;
}

export async function workerUsage(client: SeppClient): Promise<void> {
  const options: WorkerOptions = {
    queues: ["receipts", "emails"],
    leaseDurationMs: 30_000,
    maxInFlight: 8,
    autoExtend: true,
    waitTimeoutMs: 5_000,
    shutdownTimeoutMs: 10_000,
    workerId: "w-1",
    handleSignals: false,
  };
  const worker: Worker = new Worker(client, options)
    .handle("receipt", async (job, { signal, leaseExpiresAt }) => {
      const data: Uint8Array | undefined = job.payload?.data;
      const attempt: number = job.attempt;
      const aborted: boolean = signal.aborted;
      const until: Date | null = leaseExpiresAt;
      void data, attempt, aborted, until;
      if (attempt > 2) throw HandlerError.permanent("gave up");
      throw HandlerError.retryAfter(1_000, "busy");
    })
    .handle("sync", (job) => {
      if (job.jobType !== "sync") throw HandlerError.retry();
    })
    .fallback(async (job: Job, context: JobContext) => {
      void job, context;
    });
  const handler: Handler = async () => {};
  worker.handle("other", handler);
  const report: WorkerReport = await worker.run();
  const counts: number = report.acked + report.nacked + report.leaseLost + report.abandoned;
  // The names of earlier releases still type-check (deprecated).
  const old: number = report.succeeded + report.failed;
  void old;
  void counts;
  const stopped: void = await worker.stop();
  void stopped;

  const e: HandlerError = HandlerError.retry("why");
  const kind: "retry" | "retryAfter" | "permanent" = e.kind;
  const delay: number | undefined = e.delayMs;
  const reason: string | undefined = e.reason;
  const asError: Error = e;
  void kind, delay, reason, asError;

  const engineOptions: EngineOptions = {
    queues: ["q"],
    maxInFlight: 2,
    maxBackoffMs: 1_000,
    jobTypes: ["t"],
    handlerTimeoutMs: 5_000,
    shutdownTimeoutMs: 1_000,
  };
  const engine: Engine = await Engine.start(client, engineOptions);
  const lease: Lease | null = await engine.next();
  if (lease !== null) {
    const lost: boolean = await lease.lost();
    const expires: Date | null = lease.expiresAt;
    const outcome: Outcome = lost ? { kind: "retry" } : { kind: "retryAfter", delayMs: 500, reason: "r" };
    await engine.settle(lease.job.id, lease.job.attempt, outcome);
    await engine.settle(lease.job.id, lease.job.attempt, { kind: "success" });
    // The former name still type-checks (deprecated).
    await engine.complete(lease.job.id, lease.job.attempt, { kind: "success" });
    const end: LeaseEnd = await lease.done();
    const endKind: "settled" | "lost" | "timedOut" | "abandoned" = end.kind;
    void expires, endKind;
  }
  engine.shutdown();
  const idle: boolean = await engine.waitIdle(1_000);
  const abandoned: number = await engine.abandonAll("bye");
  const held: number = engine.inFlight;
  const drained: number = await engine.drain();
  engine.endGracePeriod();
  const engineReport: EngineReport = engine.report;
  void idle, abandoned, held, drained, engineReport;
}

export async function wrongWorkerUsage(client: SeppClient, engine: Engine): Promise<void> {
  // @ts-expect-error queues is required
  new Worker(client, { maxInFlight: 2 });
  // @ts-expect-error durations are numbers of milliseconds
  new Worker(client, { queues: ["q"], shutdownTimeoutMs: "10s" });
  // @ts-expect-error the worker takes a client, not a url
  new Worker("http://127.0.0.1:50051", { queues: ["q"] });
  const worker = new Worker(client, { queues: ["q"] });
  // @ts-expect-error a handler gets a Job, whose type is jobType
  worker.handle("t", async (job) => void job.type);
  // @ts-expect-error the context has no lease object
  worker.handle("t", async (_job, context) => void context.lease);
  // @ts-expect-error handle takes the job type first
  worker.handle(async () => {});
  // @ts-expect-error HandlerError is made by its static methods
  new HandlerError();
  // @ts-expect-error retryAfter needs the delay
  HandlerError.retryAfter();
  // @ts-expect-error the delay is a number of milliseconds
  HandlerError.retryAfter("1m");
  // @ts-expect-error not an outcome kind
  await engine.settle("id", 1, { kind: "later" });
  // @ts-expect-error retryAfter needs delayMs
  await engine.settle("id", 1, { kind: "retryAfter" });
  // @ts-expect-error options are required
  await Engine.start(client);
  // @ts-expect-error autoExtend is a boolean
  await Engine.start(client, { queues: ["q"], autoExtend: "yes" });
}

export async function wrongUsage(client: SeppClient): Promise<void> {
  // @ts-expect-error jobType is required
  await client.enqueue({ queue: "q" });
  // @ts-expect-error priority is a number
  await client.enqueue({ queue: "q", jobType: "t", priority: "high" });
  // @ts-expect-error scheduledAt is a Date, not a timestamp
  await client.enqueue({ queue: "q", jobType: "t", scheduledAt: Date.now() });
  // @ts-expect-error payload data is bytes, not a string
  await client.enqueue({ queue: "q", jobType: "t", payload: { data: "x", encoding: "e" } });
  // @ts-expect-error custom values are scalars
  await client.enqueue({ queue: "q", jobType: "t", custom: { nested: { a: 1 } } });
  // @ts-expect-error snake_case is not the JavaScript name
  await client.enqueue({ queue: "q", job_type: "t" });
  // @ts-expect-error durations are numbers of milliseconds
  await client.reserve({ queues: ["q"], leaseDurationMs: "30s" });
  // @ts-expect-error queues is a list
  await client.reserve({ queues: "q", leaseDurationMs: 1_000 });
  // @ts-expect-error attempt is required
  await client.ack("job-id");
  // @ts-expect-error retry is 'default', 'deadLetter' or { delayMs }
  await client.nack("job-id", 1, { retry: "later" });
  // @ts-expect-error max is required
  await client.drainDeadLetters({ queue: "q" });
  // @ts-expect-error a selector names jobIds or a max
  await client.deleteDeadLetters({ queue: "q" });
  // @ts-expect-error not a job state
  const state: JobState = "running";
  void state;
  // @ts-expect-error apiKey is a string
  await SeppClient.connect("http://127.0.0.1:1", { apiKey: 42 });
  // @ts-expect-error the ack has no id field
  (await client.enqueue({ queue: "q", jobType: "t" })).id;

  const results = await client.enqueueBatch([{ queue: "q", jobType: "t" }]);
  const first = results[0];
  if (first !== undefined) {
    // @ts-expect-error jobId exists only once status is narrowed to 'enqueued'
    first.jobId;
  }
  try {
    await client.enqueue({ queue: "q", jobType: "t" });
  } catch (e) {
    if (e instanceof IdempotencyKeyTooLongError) {
      // @ts-expect-error IdempotencyKeyTooLongError has no queue
      e.queue;
    }
  }
  // @ts-expect-error not an error code
  const code: ErrorCode = "NOT_A_CODE";
  void code;
}
