// A file that only type-checks (`tsc -p tsconfig.json`, never run): right usage compiles,
// each wrong usage is marked with @ts-expect-error, so tsc fails if the types accept it.

import {
  type AtomicResult,
  type DeadLetterRecord,
  type EnqueueAck,
  type EnqueueRequest,
  type EnqueueResult,
  type ErrorCode,
  IdempotencyKeyTooLong,
  type Job,
  type JobInfo,
  type JobState,
  type KeyRecord,
  type QueueStats,
  QueueFull,
  Rejection,
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
    retryPolicy: { maxAttempts: 3, initialBackoffMs: 50 },
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
  const key: KeyRecord | null = await client.lookupIdempotencyKey("emails", "user-42");
  const page = await client.listDeadLetters({ queue: "emails", pageSize: 50 });
  const next: string | undefined = page.nextPageToken;
  const requeued: string[] = await client.requeueDeadLetters({ jobIds: ["a", "b"] });
  const deleted: string[] = await client.deleteDeadLetters({ queue: "emails", max: 10 });
  await client.pauseQueue("emails");
  await client.resumeQueue("emails");
  const stats: QueueStats = await client.getQueueStats("emails");
  void state, key, next, requeued, deleted, stats;
  const info: ServerInfo = await client.getServerInfo();
  const limit: number = info.maxIdempotencyKeyBytes;
  const horizon: number | undefined = info.maxScheduleHorizonMs;
  client.close();
  void id, dedup, cause, limit, horizon;

  try {
    await client.enqueue({ queue: "q", jobType: "t", idempotencyKey: "k".repeat(257) });
  } catch (e) {
    if (e instanceof IdempotencyKeyTooLong) {
      const bytes: number = e.limit + e.actual;
      const code: "IDEMPOTENCY_KEY_TOO_LONG" = e.code;
      const rejection: Rejection = e;
      void bytes, code, rejection;
    } else if (e instanceof QueueFull) {
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
    if (e instanceof IdempotencyKeyTooLong) {
      // @ts-expect-error IdempotencyKeyTooLong has no queue
      e.queue;
    }
  }
  // @ts-expect-error not an error code
  const code: ErrorCode = "NOT_A_CODE";
  void code;
}
