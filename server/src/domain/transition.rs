//! What a transition is told and what it answers: the facts a store reads about a job, the
//! plans the queue layer decides on them, reserve specs, refusals.
//!
//! A store never decides what a job's next state is: it reads the facts ([`JobFacts`], the
//! dedup record and depth of an enqueue), hands them to the queue layer's rule, and applies
//! the plan the rule returns. So the plans here are the whole vocabulary of state changes.

use super::{JobId, UnixMs};

/// Whether the deadline `at` has been reached at `now`: a deadline is reached at its own
/// instant (`at <= now`). The one convention for every time bound: a lease is in force up to
/// `lease_expires_at - 1` and over at `lease_expires_at`; a dedup record is live up to
/// `expires_at - 1`; a scheduled job is due at `due`; a tombstone's `until` is the instant it
/// goes. Storage backends select due work with the same comparison (`<= now` in SQL).
pub fn reached(at: UnixMs, now: UnixMs) -> bool {
    at <= now
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

/// Where a job is in its lifecycle, as every backend stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting to be reserved.
    Ready,
    /// Not ready before `due`.
    Scheduled {
        /// When it becomes ready.
        due: UnixMs,
    },
    /// Leased; the lease is in force until `expires` (exclusive).
    InFlight {
        /// `lease_expires_at`.
        expires: UnixMs,
    },
    /// Dead-lettered and kept (retention on).
    Dead {
        /// Why.
        cause: DeadLetterCause,
        /// When.
        failed_at: UnixMs,
    },
    /// Acked, or dead-lettered and no longer kept, while a dedup record may still name it: only
    /// this small record remains, until `until`.
    Tombstone {
        /// When it was acked or dead-lettered.
        finished_at: UnixMs,
        /// When the record goes (the expiry of the dedup record naming the job).
        until: UnixMs,
        /// Set when it was dead-lettered.
        dead: Option<DeadLetterCause>,
    },
}

/// What a transition reads about one job, for the queue layer's rule to decide on. A borrowed,
/// copyable view: building it allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFacts<'a> {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: &'a str,
    /// Where it is.
    pub stage: Stage,
    /// Deliveries started so far (0 before the first; the attempt in flight while leased).
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// When the dedup record naming the job expires, if the job was keyed.
    pub dedup_until: Option<UnixMs>,
}

/// Ready now, or not before a time: where a new, retried or promoted job goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Ready to be reserved.
    Ready,
    /// Scheduled: ready at `due`.
    Scheduled {
        /// When it becomes ready.
        due: UnixMs,
    },
}

/// What stays of a job that leaves the live set (acked, dead-lettered, or a dead letter that
/// is drained, deleted or past its retention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Kept whole as a dead letter.
    DeadLetter {
        /// Why.
        cause: DeadLetterCause,
        /// When.
        failed_at: UnixMs,
    },
    /// Only a tombstone stays (no body), until `until`.
    Tombstone {
        /// When the job was acked or dead-lettered.
        finished_at: UnixMs,
        /// When the tombstone goes.
        until: UnixMs,
        /// Set when the job was dead-lettered.
        dead: Option<DeadLetterCause>,
    },
    /// Nothing stays.
    Delete,
}

/// What an ack, nack or extend does to the job in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The job leaves the live set (ack, or a dead-lettering nack).
    Finish(Finish),
    /// Retry (nack): back to ready or scheduled; the attempt count stays, the next delivery
    /// adds one.
    Retry(Placement),
    /// Extend: the lease is in force until `expires`.
    Extend {
        /// The new `lease_expires_at`.
        expires: UnixMs,
    },
}

/// What a settlement does to the job's last reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastReason {
    /// Left as it is (ack, extend).
    Unchanged,
    /// Replaced by this (a nack's reason, or none).
    Set(Option<String>),
}

/// What happens to a job whose lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Back to ready, keeping its place in the order; the next delivery is the next attempt.
    Redeliver,
    /// It leaves the live set.
    Finish(Finish),
}

/// How a dead letter is put back on its queue: enqueued anew, same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requeue {
    /// Its new enqueue time; it is ordered after every job enqueued before it.
    pub enqueued_at: UnixMs,
    /// Deliveries counted as made (0: the next delivery is attempt 1).
    pub attempt: u32,
}

/// Whether a record goes into a reply being filled, as the reply budget decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// It goes in, and takes this many bytes of the budget.
    Take(u64),
    /// It stays out (and stays where it is); later records may still go in.
    Skip,
    /// The reply is full: nothing more goes in.
    Stop,
}

/// The outcome of inserting one validated job, as the enqueue rule decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// A new job is written.
    Created(JobId),
    /// A live dedup record (or an earlier job of the same batch with the same key) names this
    /// job, which is where the state says; nothing is written for it.
    Deduplicated(JobId, super::JobState),
    /// A live dedup record names this job, which was still ready or scheduled, and the
    /// enqueue's contents replaced its own (`on_duplicate = "replace_pending"`); it is now
    /// where the placement says. Its id, job type, priority and attempt stay.
    Replaced(JobId, Placement),
    /// A live dedup record names `original`, and its fingerprint differs from this job's
    /// (`key_conflict = "reject"`); nothing is written for it.
    KeyConflict {
        /// The job the record names.
        original: JobId,
    },
    /// The queue holds `limit` jobs already.
    QueueFull {
        /// The queue's `max_queue_depth`.
        limit: u64,
    },
    /// The job's queue does not exist yet and the store holds `limit` queues already.
    TooManyQueues {
        /// `limits.max_queues`.
        limit: u64,
    },
}

impl InsertOutcome {
    /// True for the outcomes that refuse the job (an atomic batch with one writes nothing).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            InsertOutcome::QueueFull { .. }
                | InsertOutcome::KeyConflict { .. }
                | InsertOutcome::TooManyQueues { .. }
        )
    }
}

/// The enqueue rule's decision for a whole batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueuePlan {
    /// One outcome per job, in order.
    pub outcomes: Vec<InsertOutcome>,
    /// Whether the jobs marked [`InsertOutcome::Created`] are written (false: an atomic batch
    /// with a refused job writes nothing).
    pub write: bool,
}

/// What a Reserve asks for, after clamping.
#[derive(Debug, Clone, PartialEq)]
pub struct ReserveSpec {
    /// Queues in poll order.
    pub queues: Vec<String>,
    /// At least 1.
    pub max_jobs: u32,
    /// When the leases taken end (`lease_expires_at`).
    pub lease_expires_at: UnixMs,
    /// Optional worker label, kept with the lease for inspection.
    pub worker_id: Option<String>,
    /// The reply budget: the jobs leased take at most this many bytes in the reply (each job
    /// counting the [`super::NewJob::reply_bytes`] it was enqueued with), except that the first
    /// job is always taken.
    pub max_reply_bytes: u64,
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
