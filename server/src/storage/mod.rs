//! The storage boundary: the [`Store`] trait, which speaks domain types, and its backends.
//!
//! A store is a transition engine. Each method is one atomic, durable transition: it reads
//! what the transition concerns, hands those facts to the rule the queue layer passed in (a
//! closure such as [`SettleRule`]), and applies the plan the rule returns, all inside one
//! transaction (in SQL: `SELECT … FOR UPDATE`, the rule, then the `UPDATE`/`INSERT`/`DELETE`,
//! then `COMMIT`). A store decides nothing a rule of `../shared/spec/` says: what the next
//! state of a job is, whether a dedup record is live, whether a lease is still in force, how
//! long a dead letter or a tombstone is kept. Those are decided once, in `queue/`.
//!
//! What a store does own: atomicity (the facts a rule saw are the facts the plan is applied
//! to), durability (a method that changes state returns only once the change is as durable as
//! the configured `persist_mode` promises; after a failed write, what it holds in memory equals
//! what is on disk), the orderings it keeps (ready jobs by priority then enqueue order, dead
//! letters oldest first), and selecting due work by time with [`crate::domain::reached`] (`<=
//! now`). Every time comes in as a parameter: a store reads no clock.
//!
//! Every backend passes the one behavioural suite, `storage/conformance.rs`.
//!
//! - [`embedded`]: the default backend, on fjall (no external service).
//! - [`postgres`]: one PostgreSQL database shared by any number of servers.

pub mod embedded;
pub mod postgres;

#[cfg(test)]
pub(crate) mod conformance;
#[cfg(test)]
pub(crate) mod model;

use crate::domain::{
    CancelSelector, DeadLetter, DeadLetterCursor, DeadLetterSelector, EnqueuePlan, Expiry, Finish,
    Fit, Job, JobCursor, JobFacts, JobId, KeyRecord, LastReason, ListState, NewJob, QueueStats,
    Requeue, ReserveSpec, Settle, SettleRefusal, Stage, StoredJob, UnixMs,
};
use std::sync::Arc;

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
    /// The rule a transition was given returned a plan that does not fit what the store
    /// holds (a bug in the queue layer); nothing was changed.
    #[error("storage was handed a plan it cannot apply: {0}")]
    InvalidPlan(String),
    /// The store refuses writes: there is too little free space (until space is freed), a
    /// write failed to reach the disk (until a restart), or the server is shutting down. The
    /// message says which, and names the data directory.
    #[error("{0}")]
    Unavailable(String),
}

/// The body of a job a lease just took, for the reply. A body that cannot be decoded (a
/// corrupt record) leaves that one job out, not the whole reply: the others are handed out,
/// and it is delivered again when its lease expires (a higher attempt; dead-lettered as
/// lease-expired once out of attempts), logged at `error` with its id. Other errors (the
/// store unreadable) fail the reply. `Ok(None)`: the body is gone (the job was settled by
/// someone else after its lease expired); not ours to hand out either.
pub(crate) fn leased_body<B>(
    id: JobId,
    body: Result<Option<B>, StorageError>,
) -> Result<Option<B>, StorageError> {
    match body {
        Err(e @ StorageError::Corrupt { .. }) => {
            tracing::error!(
                job_id = %id,
                error = %e,
                "a leased job's body cannot be decoded: left out of the reply, delivered again after its lease"
            );
            Ok(None)
        }
        other => other,
    }
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

/// What an enqueue's rule may read, inside the transition: the dedup record of each keyed job
/// and the depth of each queue, as they are before the batch.
pub trait EnqueueFacts {
    /// The dedup record under job `i`'s queue and idempotency key, live or expired but not
    /// purged yet; `None` for an unkeyed job or when there is none.
    fn record(&self, i: usize) -> Option<KeyRecord>;
    /// Jobs `queue` holds (ready + scheduled + in flight).
    fn depth(&self, queue: &str) -> u64;
    /// Whether the store holds `queue` (it was created by an enqueue, a pause or at start-up
    /// and not deleted since). Asked for every queue of the batch.
    fn queue_exists(&self, queue: &str) -> bool;
    /// How many queues the store holds. Asked only when a queue of the batch does not exist;
    /// then no other transition creates or deletes a queue until this one is applied.
    fn queue_count(&self) -> u64;
    /// Where job `id` is (the job a dedup record names), from what the store holds in memory
    /// where it can (a hit is answered without a disk read); `None` when nothing of it is left.
    fn stage(&self, id: JobId) -> Option<Stage>;
}

/// The enqueue rule: the plan for a batch, from the jobs and the facts
/// (`queue::enqueue::decide`).
pub type EnqueueRule<'a> = dyn Fn(&[NewJob], &dyn EnqueueFacts) -> EnqueuePlan + Sync + 'a;

/// The rule of an ack, nack or extend: from the job's facts (`None`: no such job), the plan, or
/// why the settlement is refused (the fencing of `queue::lease`).
pub type SettleRule<'a> = dyn Fn(Option<JobFacts<'_>>) -> Result<Settle, SettleRefusal> + Sync + 'a;

/// What happens to a job whose lease expired (`queue::lifecycle::lease_expired`).
pub type ExpiryRule<'a> = dyn Fn(JobFacts<'_>) -> Expiry + Sync + 'a;

/// Whether a dead letter goes into the reply being filled (`queue::reply`): from the record,
/// the bytes of the records taken so far and their number.
pub type FitRule<'a> = dyn Fn(&DeadLetter, u64, usize) -> Fit + Sync + 'a;

/// Whether a ready job goes into the Reserve reply being filled (`queue::reply::reserve_fit`):
/// from the job's reply bytes (`NewJob::reply_bytes`, kept with the job), the bytes of the jobs
/// taken so far and their number. `Fit::Skip` is not used by Reserve (it stops instead).
pub type ReserveFitRule<'a> = dyn Fn(u32, u64, usize) -> Fit + Sync + 'a;

/// What stays of a dead letter that is drained, deleted or past its retention
/// (`queue::lifecycle::leave`): a tombstone or nothing.
pub type RemovalRule<'a> = dyn Fn(JobFacts<'_>) -> Finish + Sync + 'a;

/// Whether a queue with these counts may be deleted (`queue::lifecycle::queue_deletable`).
pub type DeleteQueueRule<'a> = dyn Fn(&QueueStats) -> bool + Sync + 'a;

/// May a new queue be created while the store holds this many queues? Given only when the
/// queue does not exist (the queue cap rule, `QueueCap::admits` in the queue layer).
pub type CreateQueueRule<'a> = dyn Fn(u64) -> bool + Sync + 'a;

/// What [`Store::set_paused`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseOutcome {
    /// The flag is set (a pause of a queue the store did not hold created it); the queue's
    /// ready jobs.
    Set {
        /// Ready jobs of the queue.
        ready: u64,
    },
    /// A resume of a queue the store does not hold: nothing to do, nothing created.
    Absent,
    /// A pause of a queue the store does not hold, refused by the rule: nothing changed.
    TooManyQueues,
}

/// What [`Store::delete_queue`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueDeletion {
    /// The store holds no such queue.
    NotFound,
    /// The rule refused: the queue's counts, as read. Nothing changed.
    Refused(QueueStats),
    /// The queue is gone: its counts just before (the dedup records and the paused flag it had).
    Deleted(QueueStats),
}

/// A settlement as applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The plan the rule returned.
    pub plan: Settle,
    /// The job's queue.
    pub queue: Arc<str>,
}

/// Queues that got ready jobs in a transition, and how many each: the queue layer wakes that
/// many waiting Reserves.
pub type ReadyJobs = Vec<(Arc<str>, usize)>;

/// One bounded maintenance pass, as the sweeper plans it.
pub struct SweepPass<'a> {
    /// The time of the pass: leases, schedules, dedup records and tombstones whose time is
    /// [`crate::domain::reached`] at `now` are due.
    pub now: UnixMs,
    /// Most items handled.
    pub budget: usize,
    /// Dead letters that failed at or before this time are past their retention.
    pub retained_until: UnixMs,
    /// What an expired lease does.
    pub lease_expired: &'a ExpiryRule<'a>,
    /// What stays of a dead letter past its retention.
    pub retention_over: &'a RemovalRule<'a>,
}

/// The earliest pending time of each kind of due work, for the sweeper's next wake-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// The earliest `lease_expires_at`.
    pub lease: Option<UnixMs>,
    /// The earliest scheduled time.
    pub scheduled: Option<UnixMs>,
    /// The earliest dedup record expiry.
    pub dedup: Option<UnixMs>,
    /// The `failed_at` of the oldest dead letter.
    pub oldest_dead_letter: Option<UnixMs>,
    /// The earliest tombstone `until`.
    pub tombstone: Option<UnixMs>,
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Expired leases whose jobs went back to ready.
    pub redelivered: u64,
    /// Jobs that left the live set by lease expiry (on their last attempt).
    pub dead_lettered: u64,
    /// Scheduled jobs that became ready.
    pub promoted: u64,
    /// Expired dedup records removed.
    pub dedup_purged: u64,
    /// Dead letters and tombstones removed after their time.
    pub records_purged: u64,
    /// True when the pass stopped at its budget with more work due.
    pub more: bool,
    /// Queues that got ready jobs.
    pub ready: ReadyJobs,
    /// Queues whose jobs were dead-lettered by lease expiry, and how many each.
    pub dead_lettered_by_queue: ReadyJobs,
    /// What is due next.
    pub deadlines: Deadlines,
}

/// Where a backend reports jobs that became ready without a transition of this server: made
/// ready by another server on the same database (PostgreSQL `LISTEN/NOTIFY`), or found ready
/// again when the backend rebuilt its state. The queue layer's ready signals implement it, so
/// that a waiting Reserve has one path for local and remote wake-ups.
pub trait ReadyListener: Send + Sync {
    /// `n` jobs of `queue` became ready.
    fn jobs_ready(&self, queue: &str, n: usize);
    /// Any queue may have ready jobs now: every waiter looks again.
    fn all_may_be_ready(&self);
}

/// One queue's gauges, read from the store at a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueGauges {
    /// The queue's name.
    pub queue: String,
    /// Its jobs by state and its dedup records.
    pub stats: QueueStats,
    /// The `enqueued_at` of its oldest ready job (the back of the line after a requeue or a
    /// retry counts from then), if any is ready.
    pub oldest_ready_at: Option<UnixMs>,
}

/// Store-wide gauges: what every server on the store would report alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreGauges {
    /// Every queue the store holds jobs, dead letters or dedup records of, by name.
    pub queues: Vec<QueueGauges>,
    /// Dedup records, live or expired and not yet swept.
    pub dedup_records: u64,
    /// The `created_at` of the dedup record that expires next (the oldest one when every
    /// queue has the same window).
    pub next_expiring_dedup_created_at: Option<UnixMs>,
}

/// What happened to one queue's jobs in one minute, counted by the servers that did it
/// (`queue::rates`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateCounts {
    /// Jobs created by enqueues.
    pub enqueued: u64,
    /// Deliveries acked.
    pub acked: u64,
    /// Deliveries nacked (retried or dead-lettered).
    pub nacked: u64,
    /// Jobs dead-lettered (by a nack, or by lease expiry on their last attempt).
    pub dead_lettered: u64,
}

impl RateCounts {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &RateCounts) {
        self.enqueued += other.enqueued;
        self.acked += other.acked;
        self.nacked += other.nacked;
        self.dead_lettered += other.dead_lettered;
    }

    /// True when every count is 0.
    pub fn is_zero(&self) -> bool {
        *self == RateCounts::default()
    }
}

/// One queue's counts of one minute (Unix milliseconds / 60 000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateBucket {
    /// The minute: Unix time in whole minutes.
    pub minute: i64,
    /// The queue.
    pub queue: String,
    /// Its counts.
    pub counts: RateCounts,
}

/// Told of each durable commit, for the metrics (`crate::metrics`): how many writes the batch
/// held and how long making it durable took.
pub trait CommitObserver: Send + Sync {
    /// A batch of `writes` writes became durable in `took`.
    fn committed(&self, writes: usize, took: std::time::Duration);
}

/// The persistence contract every backend implements. Object-safe: the server holds an
/// `Arc<dyn Store>`.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts a batch of validated jobs, in order. Reads the dedup record of every keyed job
    /// and the depth of every queue the rule asks for, hands them to `rule`, and writes the
    /// jobs the plan marks [`crate::domain::InsertOutcome::Created`] (when `plan.write`), each
    /// with its dedup record: all in one atomic step, so that concurrent enqueues of one key
    /// create one job. A created job is scheduled when its `scheduled_at` is set, ready
    /// otherwise. Returns the plan's outcomes once every job they name is durable.
    async fn enqueue(
        &self,
        jobs: Vec<NewJob>,
        rule: &EnqueueRule<'_>,
        now: UnixMs,
    ) -> Result<Vec<crate::domain::InsertOutcome>, StorageError>;

    /// Leases up to `spec.max_jobs` ready jobs from `spec.queues` in list order (paused queues
    /// skipped), highest priority then enqueue order first, as `fit` lets them into the reply
    /// (the reply ends where `fit` stops it): each gets the next attempt, the lease
    /// `spec.lease_expires_at` and the worker label. Returns at once (empty when nothing is
    /// ready); waiting is the queue layer's job.
    async fn reserve(
        &self,
        spec: &ReserveSpec,
        fit: &ReserveFitRule<'_>,
        now: UnixMs,
    ) -> Result<Vec<Job>, StorageError>;

    /// Acks, nacks or extends job `id`: reads its facts, asks `rule`, applies the plan (a
    /// nack's `reason` with it). `Ok(Err(_))` is the rule's refusal; nothing changed.
    async fn settle(
        &self,
        id: JobId,
        rule: &SettleRule<'_>,
        reason: LastReason,
        now: UnixMs,
    ) -> Result<Result<Settled, SettleRefusal>, StorageError>;

    /// [`Store::settle`], then, only if the settlement was applied, [`Store::reserve`] with
    /// `spec` and `fit` (same `now`): a worker's ack that asks for its next job. A backend may
    /// commit both in one write (the embedded one does); the default runs one after the other.
    /// `Ok(Ok((settled, None)))`: the settlement is durable but the lease failed (the reply
    /// says so and the worker reserves on its own); the error is logged.
    async fn settle_then_reserve(
        &self,
        id: JobId,
        rule: &SettleRule<'_>,
        now: UnixMs,
        spec: &ReserveSpec,
        fit: &ReserveFitRule<'_>,
    ) -> Result<Result<(Settled, Option<Vec<Job>>), SettleRefusal>, StorageError> {
        let settled = match self.settle(id, rule, LastReason::Unchanged, now).await? {
            Ok(s) => s,
            Err(r) => return Ok(Err(r)),
        };
        let next = match self.reserve(spec, fit, now).await {
            Ok(jobs) => Some(jobs),
            Err(e) => {
                tracing::warn!(error = %e, "the lease after an ack failed; the ack took");
                None
            }
        };
        Ok(Ok((settled, next)))
    }

    /// Removes and returns up to `max` dead letters, oldest first, of one queue or all, as
    /// `fit` lets them into the reply: a record is removed only if it is returned (or has no
    /// body left to send); one `fit` skips stays, and the drain ends where `fit` stops it. What
    /// stays of each removed record is `rule`'s answer.
    async fn drain_dead_letters(
        &self,
        queue: Option<&str>,
        max: u32,
        fit: &FitRule<'_>,
        rule: &RemovalRule<'_>,
        now: UnixMs,
    ) -> Result<Vec<DeadLetter>, StorageError>;

    /// One bounded maintenance pass: expired leases (per `pass.lease_expired`), due scheduled
    /// jobs (to ready), expired dedup records (removed), dead letters past their retention (per
    /// `pass.retention_over`) and tombstones past their time (removed).
    async fn maintain(&self, pass: &SweepPass<'_>) -> Result<Maintenance, StorageError>;

    /// Everything stored about job `id` (including a tombstone), or `None`; with what it
    /// carries ([`StoredJob::content`]: payload, custom entries, trace context) while it has a
    /// body (a tombstone has none).
    async fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, StorageError>;

    /// The dedup record of `key` on `queue`, live or expired but not purged yet.
    async fn lookup_key(&self, queue: &str, key: &str) -> Result<Option<KeyRecord>, StorageError>;

    /// Ends every lease held by `worker_id` at once, each job as `rule` says (exactly as if its
    /// lease had expired: redelivered, or on its last attempt dead-lettered). Returns the ids
    /// released and the queues that got ready jobs.
    async fn release_leases(
        &self,
        worker_id: &str,
        rule: &ExpiryRule<'_>,
        now: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError>;

    /// Deletes the dedup record of `key` on `queue` (live, or expired and not purged yet), so
    /// that the next enqueue with the key creates a new job; returns the record removed. The
    /// job it named is untouched (a tombstone of it stays until its own time).
    async fn forget_key(&self, queue: &str, key: &str) -> Result<Option<KeyRecord>, StorageError>;

    /// Up to `limit` dead letters after `after`, oldest first, without removing them, as `fit`
    /// lets them into the page. Returns the page and the cursor of its last record when more
    /// may follow (the page was full, or `fit` stopped it).
    async fn list_dead_letters(
        &self,
        queue: Option<&str>,
        after: Option<DeadLetterCursor>,
        limit: u32,
        fit: &FitRule<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StorageError>;

    /// Puts the selected dead letters back on their queues as `plan` says (same id, the dedup
    /// index untouched). Returns the ids requeued and the queues that got ready jobs.
    async fn requeue_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        plan: Requeue,
        now: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError>;

    /// Deletes the selected dead letters; what stays of each is `rule`'s answer. Returns the
    /// ids deleted.
    async fn delete_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        rule: &RemovalRule<'_>,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError>;

    /// Pauses (Reserve skips the queue) or resumes a queue; survives restarts. A pause of a
    /// queue the store does not hold creates it if `may_create` allows it given the number of
    /// queues held, read in the same atomic step (several servers cannot together pass the
    /// cap); a resume of such a queue changes nothing.
    async fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        may_create: &CreateQueueRule<'_>,
    ) -> Result<PauseOutcome, StorageError>;

    /// Counts of a queue's jobs by state.
    async fn queue_stats(&self, queue: &str) -> Result<QueueStats, StorageError>;

    /// Adds `buckets` to the per-minute counts the store keeps (a bucket's counts are added to
    /// what the same queue and minute hold, so several servers sum up), then removes every
    /// bucket of a minute before `keep_from`.
    async fn add_rates(&self, buckets: &[RateBucket], keep_from: i64) -> Result<(), StorageError>;

    /// Every bucket of a minute at or after `from`, by minute then queue.
    async fn rates(&self, from: i64) -> Result<Vec<RateBucket>, StorageError>;

    /// Creates the queues of `names` that the store does not hold (unpaused, empty); the others
    /// are left as they are. Not subject to `limits.max_queues` (the declared queues, at
    /// start-up).
    async fn create_queues(&self, names: &[String]) -> Result<(), StorageError>;

    /// Deletes `queue` if `rule` allows it given the queue's counts, read in the same atomic
    /// step as the deletion (a job enqueued concurrently is either counted or enqueued after,
    /// into a new queue of the same name). The queue's record goes with its paused flag; its
    /// dedup records and the tombstones they name stay until their own time.
    async fn delete_queue(
        &self,
        queue: &str,
        rule: &DeleteQueueRule<'_>,
    ) -> Result<QueueDeletion, StorageError>;

    /// Every queue's counts, the age of its oldest ready job, and the dedup records: what a
    /// metrics scrape reports. Queues are sorted by name.
    async fn gauges(&self) -> Result<StoreGauges, StorageError>;

    /// Registers who is told of each durable commit ([`CommitObserver`]); a backend without
    /// group commits may ignore it.
    fn observe_commits(&self, _observer: Arc<dyn CommitObserver>) {}
    /// Up to `limit` queues the store knows (that hold or held a job, or were paused), by name
    /// in byte order, after the name `after` when given, each with its counts. Returns the
    /// page and whether more queues follow it.
    async fn list_queues(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<(String, QueueStats)>, bool), StorageError>;

    /// Up to `limit` jobs of `queue` in `state`, in that state's order (ready: priority then
    /// enqueue order; scheduled: scheduled time; in flight: lease end; dead letters: oldest
    /// first; ties by id), after the cursor `after` when given, without what they carry
    /// ([`StoredJob::content`] is `None`). Returns each job with its cursor, and whether more
    /// jobs follow the page.
    async fn list_jobs(
        &self,
        queue: &str,
        state: ListState,
        after: Option<JobCursor>,
        limit: u32,
    ) -> Result<(Vec<(JobCursor, StoredJob)>, bool), StorageError>;

    /// Cancels the selected jobs that are ready or scheduled (others are skipped): each takes
    /// `reason` as its last reason, and what stays of it is `rule`'s answer (a tombstone while
    /// its dedup record lives, or nothing); the dedup index is untouched, so a retried enqueue
    /// of its key still answers its id. Returns the ids cancelled.
    async fn cancel_jobs(
        &self,
        selector: &CancelSelector,
        rule: &RemovalRule<'_>,
        reason: &str,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError>;

    /// Registers where to report jobs made ready elsewhere ([`ReadyListener`]). Called once,
    /// when the queue layer is built over the store.
    fn listen(&self, listener: Arc<dyn ReadyListener>);

    /// The store's health, updated whenever it starts or stops taking writes; `serve` forwards
    /// it to the gRPC health service.
    fn health(&self) -> tokio::sync::watch::Receiver<StorageHealth>;

    /// Flushes everything and makes it durable; called once at shutdown. Writes after it are
    /// refused.
    async fn close(&self) -> Result<(), StorageError>;

    /// Writes a consistent copy of everything stored, as of one instant (every write
    /// acknowledged before the call is in it), into `dir`, a new data directory this backend
    /// opens as it opens its own, made durable before returning. `dir` does not exist or is an
    /// empty directory (the caller checks). Writes go on meanwhile.
    async fn backup(&self, dir: &std::path::Path) -> Result<BackupReport, StorageError>;
}

/// What [`Store::backup`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackupReport {
    /// Records copied.
    pub records: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}
