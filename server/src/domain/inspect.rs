//! What inspection reads: dead letters, job states, queue counts, dedup records.

use super::{DeadLetterCause, Job, JobId, Payload, Stage, TraceContext, UnixMs, Value};
use std::collections::BTreeMap;

/// A dead-lettered job and how it got there.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The job as last delivered.
    pub job: Job,
    /// Why.
    pub cause: DeadLetterCause,
    /// When.
    pub failed_at: UnixMs,
    /// The attempt that failed last.
    pub final_attempt: u32,
    /// The reason given by the last nack, if any.
    pub last_reason: Option<String>,
}

/// Where a job is, as job inspection reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its scheduled time (or a retry delay).
    Scheduled,
    /// Ready to be reserved.
    Ready,
    /// Leased to a worker.
    InFlight,
    /// Dead-lettered (kept while retention lasts; after that, while a dedup record names it).
    DeadLettered,
    /// Acked; a tombstone kept while a dedup record may name it.
    Acked,
    /// Gone (a dead letter drained, deleted or past its retention) while the dedup record
    /// naming it lives: only a dedup hit reports it (`queue::dedup::original_state`).
    Deleted,
}

/// Everything job inspection reports about one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    /// Its id.
    pub id: JobId,
    /// Its state.
    pub state: JobState,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// The attempt in flight, or the last one made (0 before the first delivery).
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// 0–9.
    pub priority: u8,
    /// Enqueue time (requeue time for a requeued dead letter).
    pub enqueued_at: UnixMs,
    /// When it becomes ready, while scheduled.
    pub scheduled_at: Option<UnixMs>,
    /// When its lease ends, while in flight.
    pub lease_expires_at: Option<UnixMs>,
    /// The reason of the last nack.
    pub last_reason: Option<String>,
    /// When it was acked or dead-lettered.
    pub finished_at: Option<UnixMs>,
    /// Why it was dead-lettered.
    pub dead_letter_cause: Option<DeadLetterCause>,
    /// Its idempotency key, while its body is kept.
    pub idempotency_key: Option<String>,
    /// The worker label of the current lease.
    pub worker_id: Option<String>,
    /// What it carries: set by the lookup of one job by id, `None` in listings and once only
    /// a tombstone is left of it.
    pub content: Option<JobContent>,
}

/// What a job carries, as its producer enqueued it (or a dedup hit replaced it): read from its
/// body for job inspection by id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobContent {
    /// Its data, if it has any.
    pub payload: Option<Payload>,
    /// Its custom entries.
    pub custom: BTreeMap<String, Value>,
    /// Its trace context, if it has one.
    pub trace_context: Option<TraceContext>,
}

/// One job as a store holds it, for inspection (the queue layer derives [`JobInfo`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredJob {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// Where it is.
    pub stage: Stage,
    /// Deliveries started so far.
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// 0–9.
    pub priority: u8,
    /// Enqueue time (requeue time for a requeued dead letter).
    pub enqueued_at: UnixMs,
    /// The reason of the last nack.
    pub last_reason: Option<String>,
    /// Its idempotency key, while its body is kept.
    pub idempotency_key: Option<String>,
    /// The worker label of the current lease.
    pub worker_id: Option<String>,
    /// What it carries: filled by `Store::get_job` while the job has a body (not a
    /// tombstone), `None` in `Store::list_jobs`.
    pub content: Option<JobContent>,
}

/// Counts of one queue's jobs by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Ready jobs.
    pub ready: u64,
    /// Scheduled jobs (including retry delays).
    pub scheduled: u64,
    /// Leased jobs.
    pub in_flight: u64,
    /// Dead letters kept.
    pub dead_lettered: u64,
    /// Dedup records (live, or expired and not yet swept).
    pub dedup_records: u64,
    /// Whether Reserve skips the queue.
    pub paused: bool,
}

/// A live dedup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRecord {
    /// The job the key names.
    pub job_id: JobId,
    /// When the record was written (the first accepted enqueue).
    pub created_at: UnixMs,
    /// When it stops deduplicating.
    pub expires_at: UnixMs,
    /// What defined the job, when its queue had `key_conflict = "reject"` at its enqueue.
    pub fingerprint: Option<super::Fingerprint>,
}

/// Which dead letters an operator action applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelector {
    /// Exactly these jobs (ids that are not dead letters are skipped).
    Ids(Vec<JobId>),
    /// The oldest `max`, of one queue or all.
    Oldest {
        /// One queue, or all.
        queue: Option<String>,
        /// How many.
        max: u32,
    },
}

/// A position in the dead-letter order, for paging: (failed_at, job id).
pub type DeadLetterCursor = (UnixMs, JobId);

/// The states a job listing covers (the live states and dead letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListState {
    /// Ready jobs, in reserve order (priority, then enqueue order).
    Ready,
    /// Scheduled jobs, soonest first.
    Scheduled,
    /// Leased jobs, the lease ending soonest first.
    InFlight,
    /// Dead letters, oldest first.
    DeadLettered,
}

/// A position in a job listing, for paging: the job's place in the order of its state
/// (`(9 - priority, enqueue sequence)` for ready jobs; `(time, 0)` for the others, the time
/// being the scheduled time, the lease end or `failed_at`) and its id.
pub type JobCursor = (i64, u64, JobId);

/// Which jobs a cancel or purge applies to (only ready and scheduled jobs are cancelled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelSelector {
    /// Exactly these jobs (ids of jobs that are not ready or scheduled are skipped).
    Ids(Vec<JobId>),
    /// Up to `max` of a queue's jobs: ready ones first (reserve order), then scheduled ones.
    Queue {
        /// The queue.
        queue: String,
        /// How many.
        max: u32,
    },
}
