//! What a transition is told and what it answers: reserve specs, settlement plans, refusals.

use super::UnixMs;

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
    /// ([`Job`](super::Job) sizes as `NewJob::reply_bytes` gave them), except that the first job is always taken.
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
