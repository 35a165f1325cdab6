//! Request-side types of the queue layer: an enqueue as received, a rejection, an accepted
//! enqueue. The types the [`crate::storage::Store`] trait speaks live in [`crate::domain`].

use crate::domain::{JobId, Payload, TraceContext, UnixMs, Value};

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
    /// The idempotency key's live record names `original_job_id`, whose job type, payload,
    /// encoding, priority or custom map differ from this job's (`key_conflict = "reject"`).
    /// Deterministic: a repeat gets the same answer while the record lives.
    IdempotencyKeyConflict {
        /// The job the key names.
        original_job_id: JobId,
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
    /// The queue does not exist yet, is not declared, and the store holds `limits.max_queues`
    /// queues already. Lasts until an operator deletes queues (or raises the cap).
    TooManyQueues {
        /// The queue the job would have created.
        queue: String,
        /// `limits.max_queues`.
        limit: u64,
    },
}

impl Rejection {
    /// The variant's name in snake case (the metrics' `reason` label).
    pub fn kind(&self) -> &'static str {
        match self {
            Rejection::UnknownQueue { .. } => "unknown_queue",
            Rejection::PayloadTooLarge { .. } => "payload_too_large",
            Rejection::EncodingNotAllowed { .. } => "encoding_not_allowed",
            Rejection::JobTypeNotAllowed { .. } => "job_type_not_allowed",
            Rejection::CustomEntriesTooMany { .. } => "custom_entries_too_many",
            Rejection::CustomMapTooLarge { .. } => "custom_map_too_large",
            Rejection::CustomKeyTooLong { .. } => "custom_key_too_long",
            Rejection::QueueNameTooLong { .. } => "queue_name_too_long",
            Rejection::JobTypeNameTooLong { .. } => "job_type_name_too_long",
            Rejection::IdempotencyKeyTooLong { .. } => "idempotency_key_too_long",
            Rejection::ScheduledTooFar { .. } => "scheduled_too_far",
            Rejection::InvalidRequest { .. } => "invalid_request",
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::QueueClosing { .. } => "queue_closing",
            Rejection::TooManyQueues { .. } => "too_many_queues",
            Rejection::IdempotencyKeyConflict { .. } => "idempotency_key_conflict",
        }
    }

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
    /// On a hit: where that job is now.
    pub original_state: Option<crate::domain::JobState>,
    /// On a hit on a queue with `on_duplicate = "replace_pending"`: true when this enqueue's
    /// contents replaced the pending job's (`original_state` is then where the job is after
    /// it).
    pub replaced: bool,
}

/// The outcome of one job of a batch.
pub type JobOutcome = Result<Accepted, Rejection>;
