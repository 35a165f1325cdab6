//! Domain types: what a job, an enqueue and a rejection are, independent of gRPC and of storage.
//!
//! Times are milliseconds since the Unix epoch ([`UnixMs`]); durations are milliseconds in
//! fields whose names end in `_ms`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, UTC.
pub type UnixMs = i64;

/// The current wall-clock time in milliseconds since the Unix epoch.
pub fn now_ms() -> UnixMs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A job id: a UUID v4 assigned by the server, kept as its 128-bit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u128);

impl JobId {
    /// A fresh random (v4) id.
    pub fn new_v4() -> Self {
        JobId(uuid::Uuid::new_v4().as_u128())
    }

    /// Parses the hyphenated (or simple) UUID text form. Returns `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        uuid::Uuid::try_parse(s).ok().map(|u| JobId(u.as_u128()))
    }

    /// The 16 big-endian bytes, used as a storage key.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The inverse of [`JobId::to_bytes`].
    pub fn from_bytes(b: [u8; 16]) -> Self {
        JobId(u128::from_be_bytes(b))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        uuid::Uuid::from_u128(self.0).hyphenated().fmt(f)
    }
}

/// A value in a job's custom map.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// UTF-8 text; counts its length in bytes toward `max_custom_total_bytes`.
    String(String),
    /// A double; counts 8 bytes.
    Double(f64),
    /// A signed 64-bit integer; counts 8 bytes.
    Int(i64),
    /// A boolean; counts 1 byte.
    Bool(bool),
}

impl Value {
    /// The bytes this value counts toward `max_custom_total_bytes`.
    pub fn counted_bytes(&self) -> u64 {
        match self {
            Value::String(s) => s.len() as u64,
            Value::Double(_) | Value::Int(_) => 8,
            Value::Bool(_) => 1,
        }
    }
}

/// A job's data and the hint for reading it.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// The bytes; never empty in a stored job.
    pub data: Vec<u8>,
    /// A non-empty hint such as a MIME type.
    pub encoding: String,
}

/// W3C trace context carried with a job.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceContext {
    /// The `traceparent` header value; non-empty.
    pub traceparent: String,
    /// The `tracestate` header value.
    pub tracestate: Option<String>,
}

/// An enqueue as received, before validation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnqueueInput {
    /// Target queue name.
    pub queue: String,
    /// What the job is; workers dispatch on it.
    pub job_type: String,
    /// Optional data.
    pub payload: Option<Payload>,
    /// Optional idempotency key, compared byte for byte.
    pub idempotency_key: Option<String>,
    /// 0–9; unset takes the queue's default.
    pub priority: Option<u32>,
    /// At least 1; unset takes the queue's default; clamped to the ceiling.
    pub max_attempts: Option<u32>,
    /// Optional trace context.
    pub trace_context: Option<TraceContext>,
    /// Custom entries in request order; `None` values are entries whose oneof was left unset.
    pub custom: Vec<(String, Option<Value>)>,
    /// When the job becomes ready; `None` or a past time means at once. `Err` holds why the
    /// wire encoding was not a valid timestamp (rejected as `InvalidRequest`).
    pub scheduled_at: Option<Result<UnixMs, String>>,
}

/// The claim a keyed job makes on the dedup index.
#[derive(Debug, Clone, PartialEq)]
pub struct DedupClaim {
    /// The idempotency key, exactly as sent.
    pub key: String,
    /// When the record stops deduplicating (first accepted enqueue + the queue's window).
    pub expires_at: UnixMs,
}

/// A validated job, with every default resolved, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The id it gets if it is created (not used on a dedup hit).
    pub id: JobId,
    /// Queue name.
    pub queue: Arc<str>,
    /// Job type.
    pub job_type: String,
    /// Optional data.
    pub payload: Option<Payload>,
    /// 0–9.
    pub priority: u8,
    /// At least 1.
    pub max_attempts: u32,
    /// Optional trace context.
    pub trace_context: Option<TraceContext>,
    /// Custom entries.
    pub custom: BTreeMap<String, Value>,
    /// The enqueue time.
    pub enqueued_at: UnixMs,
    /// Set when the job is not ready before this time (strictly in the future at enqueue).
    pub scheduled_at: Option<UnixMs>,
    /// Set for a keyed enqueue.
    pub dedup: Option<DedupClaim>,
    /// The queue's `max_queue_depth`, checked when the job is committed.
    pub max_queue_depth: Option<u64>,
}

/// Why one job was not accepted; mirrors the protocol's `JobRejection` variants.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// Strict mode and the queue is not declared.
    UnknownQueue {
        /// The queue named.
        queue: String,
    },
    /// The payload is larger than `max_payload_bytes`.
    PayloadTooLarge {
        /// Bytes allowed.
        limit: u64,
        /// Bytes sent.
        actual: u64,
    },
    /// The payload encoding is not in `allowed_encodings`.
    EncodingNotAllowed {
        /// The encoding sent.
        encoding: String,
        /// The encodings allowed (empty: no payloads at all).
        allowed: Vec<String>,
    },
    /// The job type is not in the queue's `allowed_job_types`.
    JobTypeNotAllowed {
        /// The job type sent.
        job_type: String,
        /// The job types allowed.
        allowed: Vec<String>,
    },
    /// More custom entries than `max_custom_entries`.
    CustomEntriesTooMany {
        /// Entries allowed.
        limit: u32,
        /// Entries sent.
        actual: u32,
    },
    /// The custom map is larger than `max_custom_total_bytes`.
    CustomMapTooLarge {
        /// Bytes allowed.
        limit: u64,
        /// Bytes counted.
        actual: u64,
    },
    /// A custom key is longer than `max_custom_key_bytes`.
    CustomKeyTooLong {
        /// The key.
        key: String,
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The queue name is longer than `max_queue_name_bytes`.
    QueueNameTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The job type is longer than `max_job_type_bytes`.
    JobTypeNameTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The idempotency key is longer than `max_idempotency_key_bytes`.
    IdempotencyKeyTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// `scheduled_at` is further out than `max_schedule_horizon_ms`.
    ScheduledTooFar {
        /// The horizon, in milliseconds.
        horizon_ms: u64,
        /// The requested time.
        actual: UnixMs,
    },
    /// A structural problem; the message names the field.
    InvalidRequest {
        /// Lowercase, names the field and what is expected.
        message: String,
    },
    /// The queue holds `max_queue_depth` jobs already (transient).
    QueueFull {
        /// The queue.
        queue: String,
        /// Its depth limit.
        limit: u64,
    },
    /// The queue is being deleted (transient).
    QueueClosing {
        /// The queue.
        queue: String,
    },
}

impl Rejection {
    /// Shorthand for [`Rejection::InvalidRequest`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Rejection::InvalidRequest {
            message: message.into(),
        }
    }
}

/// An accepted enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The job's id: the new job's, or on a dedup hit the original's.
    pub job_id: JobId,
    /// True when an earlier enqueue with the same key created `job_id`.
    pub deduplicated: bool,
}

/// The outcome of one job of a batch.
pub type JobOutcome = Result<Accepted, Rejection>;

/// A job as delivered to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// Its data.
    pub payload: Option<Payload>,
    /// 0–9.
    pub priority: u8,
    /// Trace context.
    pub trace_context: Option<TraceContext>,
    /// First enqueue time (a requeued dead letter: its requeue time).
    pub enqueued_at: UnixMs,
    /// Which delivery this is, 1-based.
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// When the current lease ends (unset outside a delivery).
    pub lease_expires_at: Option<UnixMs>,
    /// Custom entries.
    pub custom: BTreeMap<String, Value>,
    /// When the job was scheduled to become ready, if it was scheduled.
    pub scheduled_at: Option<UnixMs>,
}

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterCause {
    /// Nacked (or retried) on its last attempt.
    AttemptsExhausted,
    /// Nacked with the `dead_letter` strategy.
    Rejected,
    /// Its lease expired on its last attempt.
    LeaseExpired,
    /// An operator moved it.
    Admin,
}

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

/// What a Reserve asks for, after clamping.
#[derive(Debug, Clone, PartialEq)]
pub struct ReserveSpec {
    /// Queues in poll order.
    pub queues: Vec<String>,
    /// At least 1.
    pub max_jobs: u32,
    /// The lease length in milliseconds (already clamped).
    pub lease_ms: u64,
    /// Optional worker label, kept with the lease for inspection.
    pub worker_id: Option<String>,
    /// The reply budget: the jobs leased take at most this many bytes in the reply
    /// ([`super::reply::job_bytes`] each), except that the first job is always taken.
    pub max_reply_bytes: u64,
}

/// What to do with a nacked job, decided by the queue layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackPlan {
    /// Back to ready at this time (now or later).
    Retry {
        /// When the job becomes ready again.
        ready_at: UnixMs,
    },
    /// Dead-letter it with this cause.
    DeadLetter(DeadLetterCause),
}

/// A leased job's position, as the queue layer needs it to plan a nack.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// Its queue.
    pub queue: String,
    /// The attempt in flight.
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
}

/// Why an ack, nack or extend was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleRefusal {
    /// The job is not in flight: acked, lease expired, dead-lettered or never existed.
    NotInFlight,
    /// The job is in flight under another attempt.
    AttemptMismatch {
        /// The attempt actually in flight.
        current: u32,
    },
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
    Completed,
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
