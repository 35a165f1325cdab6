//! The storage boundary: the [`Store`] trait, which speaks domain types, and its backends.
//!
//! Each method is one atomic transition with a domain name. The dedup lookup and the insert, and
//! the attempt check and the settlement, happen inside one transition, so atomicity lives here
//! and not in the callers. A method that changes state returns only once the change is as
//! durable as the configured `persist_mode` promises.
//!
//! - [`embedded`]: the default backend, on fjall (no external service).

pub mod embedded;

use crate::queue::model::{
    DeadLetter, DeadLetterCursor, DeadLetterSelector, InFlight, Job, JobId, JobInfo, KeyRecord,
    NackPlan, NewJob, QueueStats, ReserveSpec, SettleRefusal, UnixMs,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// A storage failure. Requests that meet one get `INTERNAL`, except
/// [`StorageError::Unavailable`], which gets `UNAVAILABLE`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The engine reported an I/O error.
    #[error("storage i/o error: {0}")]
    Io(String),
    /// A record could not be decoded.
    #[error("corrupt record in {what}: {detail}")]
    Corrupt {
        /// Which record kind.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The data directory was written by a newer, incompatible sepp.
    #[error(
        "data directory format version {found} is not supported (this sepp reads up to {supported})"
    )]
    FormatVersion {
        /// Version on disk.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// The store refuses writes: there is too little free space (until space is freed), a
    /// write failed to reach the disk (until a restart), or the server is shutting down. The
    /// message says which, and names the data directory.
    #[error("{0}")]
    Unavailable(String),
}

/// Whether the store takes writes, as the health service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StorageHealth {
    /// Reads and writes work.
    #[default]
    Serving,
    /// Writes are refused until a condition clears on its own (free space back above
    /// `storage.min_free_bytes`); reads work.
    Refusing(String),
    /// Writes are refused until the server is restarted (a write or fsync failed for another
    /// reason than a lack of space).
    Failed(String),
}

/// The outcome of inserting one validated job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// A new job was written.
    Created(JobId),
    /// A live dedup record named this job; nothing was written for it.
    Deduplicated(JobId),
    /// The queue holds `limit` jobs already.
    QueueFull {
        /// The queue's `max_queue_depth`.
        limit: u64,
    },
}

/// What one sweeper pass did, and when the next one is due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Expired leases whose jobs went back to ready.
    pub redelivered: u64,
    /// Jobs dead-lettered by lease expiry on their last attempt.
    pub dead_lettered: u64,
    /// Scheduled jobs that became ready.
    pub promoted: u64,
    /// Expired dedup records removed.
    pub dedup_purged: u64,
    /// Dead letters and tombstones removed after their retention.
    pub records_purged: u64,
    /// True when the pass stopped at its budget with more work due.
    pub more: bool,
    /// The earliest future deadline (lease expiry, scheduled time, record expiry), if any.
    pub next_deadline: Option<UnixMs>,
}

/// The persistence contract every backend implements.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts validated jobs in order. For each keyed job the dedup lookup and the insert are
    /// one atomic step: a live record (or an earlier job of the same batch with the same key)
    /// makes it [`InsertOutcome::Deduplicated`]. With `atomic`, if any job would be refused
    /// (`QueueFull`), nothing is written and the outcomes say which.
    async fn enqueue(
        &self,
        jobs: Vec<NewJob>,
        atomic: bool,
        now: UnixMs,
    ) -> Result<Vec<InsertOutcome>, StorageError>;

    /// Leases up to `spec.max_jobs` ready jobs from `spec.queues`, in list order, highest
    /// priority then oldest first. Returns at once (empty when nothing is ready); waiting is
    /// the queue layer's job.
    async fn reserve(&self, spec: &ReserveSpec, now: UnixMs) -> Result<Vec<Job>, StorageError>;

    /// The in-flight delivery of `id`, if any.
    async fn in_flight(&self, id: JobId) -> Result<Option<InFlight>, StorageError>;

    /// Acks delivery `attempt` of `id`: the job is done.
    ///
    /// Ack, nack and extend are fenced by the attempt and by the lease deadline: a delivery
    /// whose `lease_expires_at <= now` is [`SettleRefusal::NotInFlight`], whether or not
    /// [`Store::maintain`] has redelivered it yet.
    async fn ack(
        &self,
        id: JobId,
        attempt: u32,
        now: UnixMs,
    ) -> Result<Result<(), SettleRefusal>, StorageError>;

    /// Nacks delivery `attempt` of `id` and applies `plan`. Returns whether it was
    /// dead-lettered.
    async fn nack(
        &self,
        id: JobId,
        attempt: u32,
        plan: NackPlan,
        reason: Option<String>,
        now: UnixMs,
    ) -> Result<Result<bool, SettleRefusal>, StorageError>;

    /// Sets the lease of delivery `attempt` of `id` to `now + lease_ms`. Returns the new expiry.
    async fn extend(
        &self,
        id: JobId,
        attempt: u32,
        lease_ms: u64,
        now: UnixMs,
    ) -> Result<Result<UnixMs, SettleRefusal>, StorageError>;

    /// Removes and returns up to `max` dead letters, oldest first, of one queue or all. Stops
    /// before the reply would pass `max_reply_bytes` (by `queue::reply::dead_letter_bytes`) and
    /// removes only what it returns; a record larger than `max_reply_bytes` on its own is
    /// skipped and stays.
    async fn drain_dead_letters(
        &self,
        queue: Option<&str>,
        max: u32,
        max_reply_bytes: u64,
    ) -> Result<Vec<DeadLetter>, StorageError>;

    /// One bounded sweeper pass: expires leases, promotes due scheduled jobs, purges expired
    /// dedup records and retained records past their retention.
    async fn maintain(&self, now: UnixMs, budget: usize) -> Result<Maintenance, StorageError>;

    /// Everything known about job `id` (including tombstones), or `None`.
    async fn get_job(&self, id: JobId) -> Result<Option<JobInfo>, StorageError>;

    /// The live dedup record of `key` on `queue`.
    async fn lookup_key(
        &self,
        queue: &str,
        key: &str,
        now: UnixMs,
    ) -> Result<Option<KeyRecord>, StorageError>;

    /// Up to `limit` dead letters after `after`, oldest first, without removing them, stopping
    /// early before the reply (with its page token) would pass `max_reply_bytes` as
    /// [`Store::drain_dead_letters`] does. Returns the page and the cursor of its last record
    /// when more may follow.
    async fn list_dead_letters(
        &self,
        queue: Option<&str>,
        after: Option<DeadLetterCursor>,
        limit: u32,
        max_reply_bytes: u64,
    ) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StorageError>;

    /// Puts the selected dead letters back on their queues: same id, attempt 1, enqueued now.
    /// The dedup index is not touched. Returns the ids requeued.
    async fn requeue_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError>;

    /// Deletes the selected dead letters. Returns the ids deleted.
    async fn delete_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError>;

    /// Pauses (Reserve skips the queue) or resumes a queue; survives restarts.
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), StorageError>;

    /// Counts of a queue's jobs by state.
    async fn queue_stats(&self, queue: &str) -> Result<QueueStats, StorageError>;

    /// Resolves when a deadline earlier than the last reported `next_deadline` appears, so
    /// the sweeper can wake early.
    async fn deadline_changed(&self);

    /// The store's health, updated whenever it starts or stops taking writes; `serve` forwards
    /// it to the gRPC health service.
    fn health(&self) -> tokio::sync::watch::Receiver<StorageHealth>;

    /// Flushes everything and makes it durable; called once at shutdown.
    async fn close(&self) -> Result<(), StorageError>;
}

/// Wake-ups for long-polling Reserves: one [`Notify`] per queue that somebody waits on.
///
/// Storage calls [`ReadySignals::job_ready`] whenever a job becomes ready (enqueue, retry,
/// redelivery, promotion); a waiting Reserve holds [`ReadySignals::subscribe`]'s `Notify`.
#[derive(Debug, Default)]
pub struct ReadySignals {
    queues: Mutex<HashMap<String, Arc<Notify>>>,
}

impl ReadySignals {
    /// The signal of `queue`, created on first use.
    pub fn subscribe(&self, queue: &str) -> Arc<Notify> {
        let mut map = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(queue.to_string()).or_default().clone()
    }

    /// Wakes up to `n` waiters of `queue` (a no-op when nobody ever waited on it).
    pub fn job_ready(&self, queue: &str, n: usize) {
        let map = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = map.get(queue) {
            for _ in 0..n {
                notify.notify_one();
            }
        }
    }

    /// Wakes every waiter of every queue (shutdown).
    pub fn wake_all(&self) {
        let map = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for notify in map.values() {
            notify.notify_waiters();
        }
    }
}
