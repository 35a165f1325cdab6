//! The domain errors of whole requests, and their small closed set of codes.
//!
//! Per-job problems are never errors: they are [`crate::queue::model::Rejection`] values in the
//! response. A [`QueueError`] fails a whole call; `api/status.rs` alone turns its
//! [`ErrorCode`] into a gRPC status, per the table in `docs/errors.md`.

use crate::storage::StorageError;

/// Stable codes of whole-request errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request is malformed (`INVALID_ARGUMENT`).
    InvalidArgument,
    /// Strict mode and an undeclared queue, the job is in flight under another attempt, or the
    /// queue to delete holds jobs (`FAILED_PRECONDITION`).
    FailedPrecondition,
    /// The job is not in flight, or the queue to delete does not exist (`NOT_FOUND`).
    NotFound,
    /// Storage failed (`INTERNAL`).
    Internal,
    /// The server sheds load: a Reserve found no job and `limits.max_waiting_reserves` wait
    /// already (`RESOURCE_EXHAUSTED`; clients report it as overload and may retry later).
    ResourceExhausted,
    /// Storage refuses writes for now: no space left, a failed write (until restart), or
    /// shutting down (`UNAVAILABLE`).
    Unavailable,
}

impl ErrorCode {
    /// Every code, for exhaustiveness checks.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidArgument,
        ErrorCode::FailedPrecondition,
        ErrorCode::NotFound,
        ErrorCode::Internal,
        ErrorCode::ResourceExhausted,
        ErrorCode::Unavailable,
    ];

    /// The SCREAMING_SNAKE name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorCode::Unavailable => "UNAVAILABLE",
        }
    }
}

/// A request that failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Malformed request; the message names the field and the limit.
    #[error("{0}")]
    InvalidArgument(String),
    /// Strict mode: the listed queues are not declared.
    #[error("queues not declared in strict mode: {}", .0.join(", "))]
    UnknownQueues(Vec<String>),
    /// The job is not in flight (acked, lease expired, dead-lettered, or never existed).
    #[error("job {0} is not in flight")]
    JobNotInFlight(String),
    /// The job is in flight under another attempt.
    #[error("job {job_id} is in flight under attempt {current}, not {sent}")]
    AttemptMismatch {
        /// The job.
        job_id: String,
        /// The attempt the caller sent.
        sent: u32,
        /// The attempt in flight.
        current: u32,
    },
    /// DeleteQueue: the store holds no queue of that name.
    #[error("queue {0:?} does not exist: nothing to delete")]
    QueueNotFound(String),
    /// DeleteQueue: the queue still holds jobs.
    #[error(
        "queue {queue:?} holds {ready} ready, {scheduled} scheduled, {in_flight} in-flight and \
         {dead_lettered} dead-lettered jobs: only an empty queue can be deleted (purge it, let \
         in-flight jobs finish, and requeue or delete its dead letters first)"
    )]
    QueueNotEmpty {
        /// The queue.
        queue: String,
        /// Its ready jobs.
        ready: u64,
        /// Its scheduled jobs.
        scheduled: u64,
        /// Its jobs in flight.
        in_flight: u64,
        /// Its dead letters.
        dead_lettered: u64,
    },
    /// PauseQueue: the queue does not exist, is not declared, and the store holds
    /// `limits.max_queues` queues already (pausing it would create it).
    #[error(
        "pausing queue {queue:?} would create a new queue past limits.max_queues ({limit}): \
         delete empty queues or raise the limit first"
    )]
    TooManyQueues {
        /// The queue.
        queue: String,
        /// `limits.max_queues`.
        limit: u64,
    },
    /// Reserve: no job was ready and `limits.max_waiting_reserves` Reserves wait already, so
    /// this one does not wait.
    #[error(
        "reserve found no job and did not wait: {limit} Reserves wait already \
         (limits.max_waiting_reserves); retry later"
    )]
    TooManyWaitingReserves {
        /// `limits.max_waiting_reserves`.
        limit: u64,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl QueueError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            QueueError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            QueueError::UnknownQueues(_)
            | QueueError::AttemptMismatch { .. }
            | QueueError::QueueNotEmpty { .. }
            | QueueError::TooManyQueues { .. } => ErrorCode::FailedPrecondition,
            QueueError::JobNotInFlight(_) | QueueError::QueueNotFound(_) => ErrorCode::NotFound,
            QueueError::TooManyWaitingReserves { .. } => ErrorCode::ResourceExhausted,
            QueueError::Storage(StorageError::Unavailable(_)) => ErrorCode::Unavailable,
            QueueError::Storage(_) => ErrorCode::Internal,
        }
    }
}
