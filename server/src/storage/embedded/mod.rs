//! The embedded backend, the default: fjall on local disk, no external service.
//!
//! Layout: an in-memory index of every job's small `codec::Meta` record (`job_index`) and of
//! the dedup records (`dedup_index`), mirrored on disk in fjall keyspaces (`codec` lists
//! them); payloads live only on disk. Every transition takes the state lock, checks and changes
//! the index, appends its writes to the group-commit batch (`group_commit`) and releases the
//! lock; it then waits, without the lock, until its batch is durable. Recovery
//! (`recovery`) rebuilds the index from the `meta` and `dedup` keyspaces.
//!
//! Why fjall: see `docs/storage-engine.md` (an LSM journal turns our small appends into
//! sequential writes, and one journal fsync covers a whole batch across keyspaces).

pub(crate) mod codec;
pub(crate) mod dedup_index;
pub(crate) mod group_commit;
pub(crate) mod job_index;
mod recovery;
mod space;

use self::codec::{Body, DedupRecord, Meta, QueueRecord, Stage};
use self::dedup_index::{DedupEntry, DedupIndex};
use self::group_commit::{Engine, GroupCommit, Keyspaces, Ks, SpaceMark, WriteOp};
use self::job_index::JobIndex;
use super::{InsertOutcome, Maintenance, ReadySignals, StorageError, StorageHealth, Store};
use crate::config::PersistMode;
use crate::queue::dedup::record_key;
use crate::queue::model::{
    DeadLetter, DeadLetterCause, DeadLetterCursor, DeadLetterSelector, InFlight, Job, JobId,
    JobInfo, JobState, KeyRecord, NackPlan, NewJob, QueueStats, ReserveSpec, SettleRefusal, UnixMs,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tokio::sync::Notify;

/// How to open the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The data directory (created if missing).
    pub path: PathBuf,
    /// Durability before a reply.
    pub persist_mode: PersistMode,
    /// How long dead letters are kept, in milliseconds; 0 deletes them at once.
    pub dead_letter_retention_ms: u64,
    /// Below this many free bytes on the data directory's filesystem, writes are refused
    /// (`UNAVAILABLE`) until space is back; 0 turns the check off.
    pub min_free_bytes: u64,
}

/// What the recovery found, for the start-up log.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecoveryReport {
    /// Jobs (any stage) in the index.
    pub jobs: usize,
    /// Live dedup records.
    pub dedup_records: usize,
    /// Expired dedup records deleted during recovery.
    pub dedup_expired: usize,
}

pub(crate) struct State {
    pub(crate) jobs: JobIndex,
    pub(crate) dedup: DedupIndex,
}

struct Shared {
    state: Mutex<State>,
    commit: GroupCommit,
    /// The fjall handles; `None` only while fjall is reopened after running out of space.
    ks: RwLock<Option<Keyspaces>>,
    path: PathBuf,
    signals: Arc<ReadySignals>,
    retention_ms: u64,
    /// The deadline the sweeper currently sleeps toward; earlier new deadlines wake it.
    next_wake: AtomicI64,
    deadline: Notify,
}

/// The embedded [`Store`].
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    /// The flusher thread; joined by [`Store::close`].
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    report: RecoveryReport,
}

fn meta_put(id: JobId, meta: &Meta) -> WriteOp {
    WriteOp::put(Ks::Meta, id.to_bytes(), meta.encode())
}

fn to_ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl EmbeddedStore {
    /// Opens (or creates) the store at `opts.path` and rebuilds its index.
    ///
    /// # Errors
    /// [`StorageError`] when the directory cannot be opened, holds a newer format, or a record
    /// cannot be decoded.
    pub fn open(opts: EmbeddedOptions, signals: Arc<ReadySignals>) -> Result<Self, StorageError> {
        create_dir_durably(&opts.path)
            .map_err(|e| StorageError::Io(format!("cannot create {}: {e}", opts.path.display())))?;
        let (ks, state, report) = recovery::open(&opts.path)?;
        sync_dirs(&opts.path).map_err(|e| {
            StorageError::Io(format!(
                "cannot sync the directories of {}: {e}",
                opts.path.display()
            ))
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            commit: GroupCommit::new(
                opts.persist_mode,
                SpaceMark {
                    dir: opts.path.clone(),
                    min_free_bytes: opts.min_free_bytes,
                },
            ),
            ks: RwLock::new(Some(ks)),
            path: opts.path.clone(),
            signals,
            retention_ms: opts.dead_letter_retention_ms,
            next_wake: AtomicI64::new(i64::MAX),
            deadline: Notify::new(),
        });
        let flusher_shared = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("sepp-flusher".into())
            .spawn(move || flusher_shared.commit.run_flusher(&*flusher_shared))
            .map_err(|e| StorageError::Io(format!("cannot start the flusher thread: {e}")))?;
        Ok(EmbeddedStore {
            shared,
            flusher: Mutex::new(Some(flusher)),
            report,
        })
    }

    /// What recovery found when the store was opened.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.report
    }

    /// Bytes on disk (journal and tables), as fjall reports them.
    pub fn disk_space(&self) -> u64 {
        self.shared
            .keyspaces()
            .map_or(0, |ks| ks.db.disk_space().unwrap_or(0))
    }
}

/// Creates `path` and its missing parents, and fsyncs the directory holding each one created
/// and the one holding `path`: fjall fsyncs what it creates inside `path`, never `path`'s own
/// entry, so without this a power loss soon after the first start could take the whole data
/// directory with every acknowledged write in it.
fn create_dir_durably(path: &std::path::Path) -> std::io::Result<()> {
    let mut created = Vec::new();
    let mut p = Some(path);
    while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        created.push(dir.to_path_buf());
        p = dir.parent();
    }
    std::fs::create_dir_all(path)?;
    let holder = |d: &std::path::Path| {
        d.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| std::path::PathBuf::from("."), |p| p.to_path_buf())
    };
    let mut synced = std::collections::BTreeSet::new();
    for dir in created.iter().map(|d| d.as_path()).chain([path]) {
        let parent = holder(dir);
        if synced.insert(parent.clone()) {
            std::fs::File::open(&parent)?.sync_all()?;
        }
    }
    Ok(())
}

/// Fsyncs every directory under `root` (a few dozen), so that every entry fjall created is
/// durable. fjall 3.1 creates each keyspace's directory without fsyncing the directory that
/// holds it: after a power loss the keyspaces could vanish while the journal that refers to
/// them survives (found by the power-cut loop of tests/crash).
fn sync_dirs(root: &std::path::Path) -> std::io::Result<()> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                todo.push(entry.path());
            }
        }
        std::fs::File::open(&dir)?.sync_all()?;
    }
    Ok(())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the sweeper if `at` is earlier than the deadline it sleeps toward.
    fn deadline_at(&self, at: UnixMs) {
        if at < self.next_wake.load(Ordering::Relaxed) {
            self.next_wake.store(at, Ordering::Relaxed);
            self.deadline.notify_one();
        }
    }

    /// The current fjall handles.
    fn ks(&self) -> Result<Keyspaces, StorageError> {
        self.keyspaces().ok_or_else(|| {
            StorageError::Unavailable(format!(
                "storage in {} is being reopened after running out of space",
                self.path.display()
            ))
        })
    }

    fn body(&self, id: JobId) -> Result<Option<Body>, StorageError> {
        match self.ks()?.jobs.get(id.to_bytes()) {
            Ok(Some(v)) => Ok(Some(Body::decode(&v)?)),
            Ok(None) => Ok(None),
            Err(e) => Err(StorageError::Io(e.to_string())),
        }
    }

    /// The reply size of a job whose meta record predates `reply_bytes`, from its body. Such a
    /// record was read at start-up, so its body is durable and can be read under the lock.
    fn reply_bytes_of_older_record(&self, st: &State, id: JobId) -> Result<u32, StorageError> {
        let (Some(meta), Some(body)) = (st.jobs.get(id), self.body(id)?) else {
            return Ok(0);
        };
        let job = assemble(id, meta, body);
        Ok(u32::try_from(crate::queue::reply::job_bytes(&job)).unwrap_or(u32::MAX))
    }

    /// A job leaves the live set (acked, or dead-lettered): kept as a dead letter when
    /// `dead` is set and retention is on; otherwise its body goes and, while a dedup record may
    /// still name it, a tombstone stays.
    fn finish(
        &self,
        st: &mut State,
        id: JobId,
        dead: Option<DeadLetterCause>,
        now: UnixMs,
        ops: &mut Vec<WriteOp>,
    ) {
        if let (Some(cause), true) = (dead, self.retention_ms > 0) {
            if let Some(m) = st.jobs.update(id, |m| {
                m.stage = Stage::Dead {
                    cause,
                    failed_at: now,
                };
            }) {
                ops.push(meta_put(id, m));
            }
            self.deadline_at(now.saturating_add(to_ms(self.retention_ms)));
            return;
        }
        Self::discard(st, id, now, dead, now, ops);
    }

    /// Deletes a job's body and then either its meta or, while a dedup record may still name
    /// the job, turns the meta into a tombstone that says how the job ended.
    fn discard(
        st: &mut State,
        id: JobId,
        finished_at: UnixMs,
        dead: Option<DeadLetterCause>,
        now: UnixMs,
        ops: &mut Vec<WriteOp>,
    ) {
        ops.push(WriteOp::delete(Ks::Jobs, id.to_bytes()));
        match st.jobs.get(id).and_then(|m| m.dedup_until) {
            Some(until) if until > now => {
                if let Some(m) = st.jobs.update(id, |m| {
                    m.stage = Stage::Tombstone {
                        finished_at,
                        until,
                        dead,
                    };
                    m.worker_id = None;
                }) {
                    ops.push(meta_put(id, m));
                }
            }
            _ => {
                st.jobs.remove(id);
                ops.push(WriteOp::delete(Ks::Meta, id.to_bytes()));
            }
        }
    }

    /// The locked part of an enqueue: plan (dedup lookups, depth checks), then apply. Returns
    /// the outcomes, the batch to wait for, the queues that got ready jobs and the earliest
    /// new schedule.
    #[allow(clippy::type_complexity)]
    fn enqueue_locked(
        &self,
        jobs: Vec<NewJob>,
        keys: Vec<Option<Vec<u8>>>,
        bodies: Vec<Vec<u8>>,
        atomic: bool,
        now: UnixMs,
    ) -> Result<
        (
            Vec<InsertOutcome>,
            u64,
            HashMap<Arc<str>, usize>,
            Option<UnixMs>,
        ),
        StorageError,
    > {
        let mut outcomes = Vec::with_capacity(jobs.len());
        let mut wait_for = 0u64;
        let mut ready: HashMap<Arc<str>, usize> = HashMap::new();
        let mut earliest: Option<UnixMs> = None;
        {
            let mut st = self.lock();
            // Under the lock, before anything changes: see `GroupCommit::check_writable`.
            self.commit.check_writable()?;
            let durable = self.commit.durable_batch();
            // Plan: dedup lookups (index, then earlier jobs of this batch) and depth checks.
            let mut batch_keys: HashMap<&[u8], JobId> = HashMap::new();
            let mut added: HashMap<&str, u64> = HashMap::new();
            for (job, key) in jobs.iter().zip(&keys) {
                if let Some(key) = key {
                    if let Some(e) = st.dedup.lookup(key, now) {
                        if e.batch > durable {
                            wait_for = wait_for.max(e.batch);
                        }
                        outcomes.push(InsertOutcome::Deduplicated(e.job_id));
                        continue;
                    }
                    if let Some(id) = batch_keys.get(key.as_slice()) {
                        outcomes.push(InsertOutcome::Deduplicated(*id));
                        continue;
                    }
                }
                if let Some(limit) = job.max_queue_depth {
                    let n = added.get(&*job.queue).copied().unwrap_or(0);
                    if st.jobs.depth(&job.queue) + n >= limit {
                        outcomes.push(InsertOutcome::QueueFull { limit });
                        continue;
                    }
                }
                *added.entry(&job.queue).or_default() += 1;
                if let Some(key) = key {
                    batch_keys.insert(key, job.id);
                }
                outcomes.push(InsertOutcome::Created(job.id));
            }
            if atomic
                && outcomes
                    .iter()
                    .any(|o| matches!(o, InsertOutcome::QueueFull { .. }))
            {
                return Ok((outcomes, wait_for, ready, earliest));
            }
            // Apply.
            let mut ops = Vec::with_capacity(jobs.len() * 3);
            let mut created = Vec::new();
            for ((job, key), (body, outcome)) in jobs
                .into_iter()
                .zip(keys)
                .zip(bodies.into_iter().zip(&outcomes))
            {
                if !matches!(outcome, InsertOutcome::Created(_)) {
                    continue;
                }
                let seq = st.jobs.next_seq;
                st.jobs.next_seq += 1;
                let stage = match job.scheduled_at {
                    Some(due) => {
                        earliest = Some(earliest.map_or(due, |e: UnixMs| e.min(due)));
                        Stage::Scheduled { due }
                    }
                    None => {
                        *ready.entry(job.queue.clone()).or_default() += 1;
                        Stage::Ready
                    }
                };
                let reply_bytes = crate::queue::reply::new_job_bytes(&job);
                let meta = Meta {
                    queue: job.queue,
                    job_type: st.jobs.intern_job_type(&job.job_type),
                    priority: job.priority,
                    seq,
                    enqueued_at: job.enqueued_at,
                    attempt: 0,
                    max_attempts: job.max_attempts,
                    stage,
                    worker_id: None,
                    last_reason: None,
                    dedup_until: job.dedup.as_ref().map(|d| d.expires_at),
                    reply_bytes,
                };
                ops.push(WriteOp::put(Ks::Jobs, job.id.to_bytes(), body));
                ops.push(meta_put(job.id, &meta));
                if let (Some(key), Some(claim)) = (key, &job.dedup) {
                    let rec = DedupRecord {
                        job_id: job.id,
                        created_at: now,
                        expires_at: claim.expires_at,
                    };
                    ops.push(WriteOp::put(Ks::Dedup, key.clone(), rec.encode()));
                    created.push((key, rec));
                }
                st.jobs.insert(job.id, meta);
            }
            let batch = self.commit.append(ops)?;
            for (key, rec) in created {
                st.dedup.insert(
                    &key,
                    DedupEntry {
                        job_id: rec.job_id,
                        created_at: rec.created_at,
                        expires_at: rec.expires_at,
                        batch,
                    },
                );
            }
            wait_for = wait_for.max(batch);
        }
        Ok((outcomes, wait_for, ready, earliest))
    }

    /// The full record of dead letter `id` (reads its body), if it is one.
    fn dead_letter(&self, id: JobId, meta: &Meta) -> Result<Option<DeadLetter>, StorageError> {
        let Stage::Dead { cause, failed_at } = meta.stage else {
            return Ok(None);
        };
        Ok(self.body(id)?.map(|body| DeadLetter {
            job: assemble(id, meta, body),
            cause,
            failed_at,
            final_attempt: meta.attempt,
            last_reason: meta.last_reason.clone(),
        }))
    }

    /// The dead letters a selector names, oldest first for a queue selection.
    fn select_dead(st: &State, selector: &DeadLetterSelector) -> Vec<JobId> {
        match selector {
            DeadLetterSelector::Ids(ids) => ids
                .iter()
                .copied()
                .filter(|id| matches!(st.jobs.get(*id).map(|m| m.stage), Some(Stage::Dead { .. })))
                .collect(),
            DeadLetterSelector::Oldest { queue, max } => st
                .jobs
                .dead_letters(queue.as_deref(), None)
                .take(*max as usize)
                .map(|(_, id)| id)
                .collect(),
        }
    }

    /// Checks that `id` is in flight under `attempt` at `now`: a lease whose deadline has
    /// passed (`expires <= now`) no longer counts as in flight, whether or not the sweeper has
    /// redelivered the job yet, so a late ack, nack or extend is refused and an extend never
    /// revives an expired lease.
    fn fence(st: &State, id: JobId, attempt: u32, now: UnixMs) -> Result<&Meta, SettleRefusal> {
        match st.jobs.get(id) {
            Some(m) if matches!(m.stage, Stage::InFlight { expires } if expires > now) => {
                if m.attempt == attempt {
                    Ok(m)
                } else {
                    Err(SettleRefusal::AttemptMismatch { current: m.attempt })
                }
            }
            _ => Err(SettleRefusal::NotInFlight),
        }
    }
}

impl Engine for Shared {
    fn keyspaces(&self) -> Option<Keyspaces> {
        self.ks.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn rebuild(&self, then: &mut dyn FnMut()) -> Result<(), StorageError> {
        let mut st = self.lock();
        if let Some(ks) = self.keyspaces() {
            let (state, report) = recovery::load_state(&ks, false)?;
            *st = state;
            tracing::info!(
                jobs = report.jobs,
                dedup_records = report.dedup_records,
                "in-memory index rebuilt from disk"
            );
        }
        then();
        drop(st);
        // Deadlines and ready jobs may differ from what the sweeper and waiters last saw.
        self.next_wake.store(i64::MAX, Ordering::Relaxed);
        self.deadline.notify_one();
        self.signals.wake_all();
        Ok(())
    }

    fn reopen(&self) -> Result<(), StorageError> {
        // Every handle must go before fjall can be opened again (it holds a lock file); a
        // reader still holding a clone makes the open fail with "locked", and it is retried.
        drop(self.ks.write().unwrap_or_else(|e| e.into_inner()).take());
        let ks = recovery::open_db(&self.path)?;
        *self.ks.write().unwrap_or_else(|e| e.into_inner()) = Some(ks);
        Ok(())
    }
}

fn assemble(id: JobId, meta: &Meta, body: Body) -> Job {
    Job {
        id,
        queue: meta.queue.to_string(),
        job_type: body.job_type,
        payload: body.payload,
        priority: meta.priority,
        trace_context: body.trace_context,
        enqueued_at: meta.enqueued_at,
        attempt: meta.attempt,
        max_attempts: meta.max_attempts,
        lease_expires_at: match meta.stage {
            Stage::InFlight { expires } => Some(expires),
            _ => None,
        },
        custom: body.custom,
        scheduled_at: body.scheduled_at,
    }
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    async fn enqueue(
        &self,
        jobs: Vec<NewJob>,
        atomic: bool,
        now: UnixMs,
    ) -> Result<Vec<InsertOutcome>, StorageError> {
        let sh = &*self.shared;
        // Refused early before encoding (and again under the lock).
        sh.commit.check_writable()?;
        // Encode outside the lock: bodies can be large.
        let keys: Vec<Option<Vec<u8>>> = jobs
            .iter()
            .map(|j| j.dedup.as_ref().map(|d| record_key(&j.queue, &d.key)))
            .collect();
        let bodies: Vec<Vec<u8>> = jobs
            .iter()
            .map(|j| {
                Body {
                    job_type: j.job_type.clone(),
                    payload: j.payload.clone(),
                    trace_context: j.trace_context.clone(),
                    custom: j.custom.clone(),
                    scheduled_at: j.scheduled_at,
                    idempotency_key: j.dedup.as_ref().map(|d| d.key.clone()),
                }
                .encode()
            })
            .collect();

        let (outcomes, wait_for, ready, earliest) =
            sh.enqueue_locked(jobs, keys, bodies, atomic, now)?;
        for (queue, n) in ready {
            sh.signals.job_ready(&queue, n);
        }
        if let Some(at) = earliest {
            sh.deadline_at(at);
        }
        sh.commit.wait(wait_for).await?;
        Ok(outcomes)
    }

    async fn reserve(&self, spec: &ReserveSpec, now: UnixMs) -> Result<Vec<Job>, StorageError> {
        let sh = &*self.shared;
        let expires = now.saturating_add(to_ms(spec.lease_ms));
        let mut leased = Vec::new();
        let batch = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let mut ops = Vec::new();
            // The reply budget: stop before the reply would pass it, so that every job leased
            // is also sent. The first job is always taken, whatever its size (a job larger
            // than the budget exists only if the limits were lowered after it was stored).
            let mut reply_bytes = 0u64;
            'queues: for queue in &spec.queues {
                if st.jobs.queue(queue).is_none_or(|q| q.paused) {
                    continue;
                }
                while leased.len() < spec.max_jobs as usize {
                    let Some(id) = st.jobs.first_ready(queue) else {
                        break;
                    };
                    let size = match st.jobs.get(id).map(|m| m.reply_bytes) {
                        None => break,
                        Some(0) => sh.reply_bytes_of_older_record(&st, id)?,
                        Some(n) => n,
                    };
                    if !leased.is_empty() && reply_bytes + u64::from(size) > spec.max_reply_bytes {
                        break 'queues;
                    }
                    reply_bytes += u64::from(size);
                    let Some(meta) = st.jobs.update(id, |m| {
                        m.attempt += 1;
                        m.stage = Stage::InFlight { expires };
                        m.worker_id.clone_from(&spec.worker_id);
                        m.reply_bytes = size;
                    }) else {
                        break;
                    };
                    ops.push(meta_put(id, meta));
                    leased.push((id, meta.clone()));
                }
            }
            if leased.is_empty() {
                return Ok(Vec::new());
            }
            sh.commit.append(ops)?
        };
        sh.deadline_at(expires);
        sh.commit.wait(batch).await?;
        let mut jobs = Vec::with_capacity(leased.len());
        for (id, meta) in leased {
            // The body was written in an earlier (now durable) batch. It is missing only if the
            // job was settled by someone else in the meantime, which needs the lease to have
            // expired already; then it is not ours to hand out.
            if let Some(body) = sh.body(id)? {
                jobs.push(assemble(id, &meta, body));
            }
        }
        Ok(jobs)
    }

    async fn in_flight(&self, id: JobId) -> Result<Option<InFlight>, StorageError> {
        let st = self.shared.lock();
        Ok(st.jobs.get(id).and_then(|m| match m.stage {
            Stage::InFlight { .. } => Some(InFlight {
                queue: m.queue.to_string(),
                attempt: m.attempt,
                max_attempts: m.max_attempts,
            }),
            _ => None,
        }))
    }

    async fn ack(
        &self,
        id: JobId,
        attempt: u32,
        now: UnixMs,
    ) -> Result<Result<(), SettleRefusal>, StorageError> {
        let sh = &*self.shared;
        let batch = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            if let Err(r) = Shared::fence(&st, id, attempt, now) {
                return Ok(Err(r));
            }
            let mut ops = Vec::with_capacity(2);
            sh.finish(&mut st, id, None, now, &mut ops);
            sh.commit.append(ops)?
        };
        sh.commit.wait(batch).await?;
        Ok(Ok(()))
    }

    async fn nack(
        &self,
        id: JobId,
        attempt: u32,
        plan: NackPlan,
        reason: Option<String>,
        now: UnixMs,
    ) -> Result<Result<bool, SettleRefusal>, StorageError> {
        let sh = &*self.shared;
        let mut ready_queue = None;
        let (batch, dead) = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            if let Err(r) = Shared::fence(&st, id, attempt, now) {
                return Ok(Err(r));
            }
            let mut ops = Vec::with_capacity(2);
            let dead = match plan {
                NackPlan::Retry { ready_at } => {
                    let stage = if ready_at <= now {
                        Stage::Ready
                    } else {
                        Stage::Scheduled { due: ready_at }
                    };
                    if let Some(m) = st.jobs.update(id, |m| {
                        m.stage = stage;
                        m.last_reason = reason;
                        m.worker_id = None;
                    }) {
                        ops.push(meta_put(id, m));
                        if stage == Stage::Ready {
                            ready_queue = Some(m.queue.clone());
                        }
                    }
                    if ready_at > now {
                        sh.deadline_at(ready_at);
                    }
                    false
                }
                NackPlan::DeadLetter(cause) => {
                    st.jobs.update(id, |m| m.last_reason = reason);
                    sh.finish(&mut st, id, Some(cause), now, &mut ops);
                    true
                }
            };
            (sh.commit.append(ops)?, dead)
        };
        if let Some(q) = ready_queue {
            sh.signals.job_ready(&q, 1);
        }
        sh.commit.wait(batch).await?;
        Ok(Ok(dead))
    }

    async fn extend(
        &self,
        id: JobId,
        attempt: u32,
        lease_ms: u64,
        now: UnixMs,
    ) -> Result<Result<UnixMs, SettleRefusal>, StorageError> {
        let sh = &*self.shared;
        let expires = now.saturating_add(to_ms(lease_ms));
        let batch = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            if let Err(r) = Shared::fence(&st, id, attempt, now) {
                return Ok(Err(r));
            }
            let Some(m) = st
                .jobs
                .update(id, |m| m.stage = Stage::InFlight { expires })
            else {
                return Ok(Err(SettleRefusal::NotInFlight));
            };
            sh.commit.append(vec![meta_put(id, m)])?
        };
        sh.deadline_at(expires);
        sh.commit.wait(batch).await?;
        Ok(Ok(expires))
    }

    async fn drain_dead_letters(
        &self,
        queue: Option<&str>,
        max: u32,
        max_reply_bytes: u64,
    ) -> Result<Vec<DeadLetter>, StorageError> {
        let sh = &*self.shared;
        let now = crate::queue::model::now_ms();
        let mut records = Vec::new();
        let batch = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let picked = Shared::select_dead(
                &st,
                &DeadLetterSelector::Oldest {
                    queue: queue.map(str::to_string),
                    max,
                },
            );
            let mut ops = Vec::new();
            // The reply budget, as in `reserve`: a record is removed only if it is sent, and
            // one larger than the whole budget (stored before the limits were lowered) is never
            // drained, since a client may be unable to read it: it stays for listing (alone),
            // requeue or delete.
            let mut reply_bytes = 0u64;
            for id in picked {
                let Some(meta) = st.jobs.get(id).cloned() else {
                    continue;
                };
                let Stage::Dead { cause, failed_at } = meta.stage else {
                    continue;
                };
                // Read before the delete is queued: once the flusher writes it the body is gone.
                // A record without its body cannot be sent, now or later; it is removed.
                if let Some(record) = sh.dead_letter(id, &meta)? {
                    let size = crate::queue::reply::dead_letter_bytes(&record);
                    if size > max_reply_bytes {
                        continue;
                    }
                    if reply_bytes + size > max_reply_bytes {
                        break;
                    }
                    reply_bytes += size;
                    records.push(record);
                }
                Shared::discard(&mut st, id, failed_at, Some(cause), now, &mut ops);
            }
            sh.commit.append(ops)?
        };
        sh.commit.wait(batch).await?;
        Ok(records)
    }

    async fn maintain(&self, now: UnixMs, budget: usize) -> Result<Maintenance, StorageError> {
        let sh = &*self.shared;
        let mut report = Maintenance::default();
        let mut ready: HashMap<Arc<str>, usize> = HashMap::new();
        let batch;
        {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let mut ops = Vec::new();
            let mut left = budget;
            // Expired leases: redeliver, or dead-letter on the last attempt.
            while left > 0 {
                let Some((expires, id)) = st.jobs.first_lease() else {
                    break;
                };
                if expires > now {
                    break;
                }
                left -= 1;
                let Some(m) = st.jobs.get(id) else { break };
                if m.attempt >= m.max_attempts {
                    sh.finish(
                        &mut st,
                        id,
                        Some(DeadLetterCause::LeaseExpired),
                        now,
                        &mut ops,
                    );
                    report.dead_lettered += 1;
                } else if let Some(m) = st.jobs.update(id, |m| {
                    m.stage = Stage::Ready;
                    m.worker_id = None;
                }) {
                    ops.push(meta_put(id, m));
                    *ready.entry(m.queue.clone()).or_default() += 1;
                    report.redelivered += 1;
                }
            }
            // Scheduled jobs that are due.
            while left > 0 {
                let Some((due, id)) = st.jobs.first_scheduled() else {
                    break;
                };
                if due > now {
                    break;
                }
                left -= 1;
                if let Some(m) = st.jobs.update(id, |m| m.stage = Stage::Ready) {
                    ops.push(meta_put(id, m));
                    *ready.entry(m.queue.clone()).or_default() += 1;
                    report.promoted += 1;
                }
            }
            // Dedup records past their window.
            let purged = st.dedup.purge_expired(now, left);
            left -= purged.len();
            report.dedup_purged = purged.len() as u64;
            for key in purged {
                ops.push(WriteOp::delete(Ks::Dedup, key.to_vec()));
            }
            // Dead letters past their retention.
            let retention = to_ms(sh.retention_ms);
            while left > 0 {
                let Some((failed_at, id)) = st.jobs.first_dead() else {
                    break;
                };
                if failed_at.saturating_add(retention) > now {
                    break;
                }
                left -= 1;
                let cause = match st.jobs.get(id).map(|m| m.stage) {
                    Some(Stage::Dead { cause, .. }) => Some(cause),
                    _ => None,
                };
                Shared::discard(&mut st, id, failed_at, cause, now, &mut ops);
                report.records_purged += 1;
            }
            // Tombstones whose dedup record has expired.
            while left > 0 {
                let Some((until, id)) = st.jobs.first_tombstone() else {
                    break;
                };
                if until > now {
                    break;
                }
                left -= 1;
                st.jobs.remove(id);
                ops.push(WriteOp::delete(Ks::Meta, id.to_bytes()));
                report.records_purged += 1;
            }
            if left == 0 {
                report.more = true;
            } else {
                st.jobs.shrink_if_sparse();
                st.dedup.shrink_if_sparse();
            }
            report.next_deadline = [
                st.jobs.first_lease().map(|x| x.0),
                st.jobs.first_scheduled().map(|x| x.0),
                st.dedup.next_expiry(),
                st.jobs.first_dead().map(|x| x.0.saturating_add(retention)),
                st.jobs.first_tombstone().map(|x| x.0),
            ]
            .into_iter()
            .flatten()
            .min();
            sh.next_wake
                .store(report.next_deadline.unwrap_or(i64::MAX), Ordering::Relaxed);
            // Sweeper writes need not be awaited for safety: if they are lost in a crash,
            // recovery finds the same deadlines passed and the next pass repeats them.
            batch = sh.commit.append(ops)?;
        }
        for (queue, n) in ready {
            sh.signals.job_ready(&queue, n);
        }
        // But during a mass expiry (more to do), wait for this pass's batch before the next
        // pass: otherwise passes outrun the flusher and pile thousands of deletes into the
        // batch that every concurrent enqueue, ack and reserve must wait for. A million
        // expiring records took the p99 of keyed enqueues from 1.4 ms to 26 ms that way.
        if report.more {
            sh.commit.wait(batch).await?;
        }
        Ok(report)
    }

    async fn get_job(&self, id: JobId) -> Result<Option<JobInfo>, StorageError> {
        let sh = &*self.shared;
        let Some(meta) = sh.lock().jobs.get(id).cloned() else {
            return Ok(None);
        };
        let body = match meta.stage {
            Stage::Tombstone { .. } => None,
            _ => sh.body(id)?,
        };
        let (state, scheduled_at, lease_expires_at, finished_at, cause) = match meta.stage {
            Stage::Ready => (JobState::Ready, None, None, None, None),
            Stage::Scheduled { due } => (JobState::Scheduled, Some(due), None, None, None),
            Stage::InFlight { expires } => (JobState::InFlight, None, Some(expires), None, None),
            Stage::Dead { cause, failed_at } => (
                JobState::DeadLettered,
                None,
                None,
                Some(failed_at),
                Some(cause),
            ),
            Stage::Tombstone {
                finished_at, dead, ..
            } => match dead {
                Some(c) => (
                    JobState::DeadLettered,
                    None,
                    None,
                    Some(finished_at),
                    Some(c),
                ),
                None => (JobState::Completed, None, None, Some(finished_at), None),
            },
        };
        Ok(Some(JobInfo {
            id,
            state,
            queue: meta.queue.to_string(),
            job_type: meta.job_type.to_string(),
            attempt: meta.attempt,
            max_attempts: meta.max_attempts,
            priority: meta.priority,
            enqueued_at: meta.enqueued_at,
            scheduled_at,
            lease_expires_at,
            last_reason: meta.last_reason,
            finished_at,
            dead_letter_cause: cause,
            idempotency_key: body.and_then(|b| b.idempotency_key),
            worker_id: meta.worker_id,
        }))
    }

    async fn lookup_key(
        &self,
        queue: &str,
        key: &str,
        now: UnixMs,
    ) -> Result<Option<KeyRecord>, StorageError> {
        let st = self.shared.lock();
        Ok(st
            .dedup
            .lookup(&record_key(queue, key), now)
            .map(|e| KeyRecord {
                job_id: e.job_id,
                created_at: e.created_at,
                expires_at: e.expires_at,
            }))
    }

    async fn list_dead_letters(
        &self,
        queue: Option<&str>,
        after: Option<DeadLetterCursor>,
        limit: u32,
        max_reply_bytes: u64,
    ) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StorageError> {
        let sh = &*self.shared;
        // Bodies are read under the lock so that a concurrent drain cannot delete them first.
        let st = sh.lock();
        let mut records = Vec::new();
        let (mut last, mut more) = (None, false);
        let mut reply_bytes = crate::queue::reply::PAGE_TOKEN_BYTES;
        for (failed_at, id) in st.jobs.dead_letters(queue, after) {
            if records.len() == limit as usize {
                more = true;
                break;
            }
            let Some(m) = st.jobs.get(id) else {
                continue;
            };
            if let Some(r) = sh.dead_letter(id, m)? {
                let size = crate::queue::reply::dead_letter_bytes(&r);
                if !records.is_empty() && reply_bytes + size > max_reply_bytes {
                    more = true;
                    break;
                }
                reply_bytes += size;
                records.push(r);
            }
            last = Some((failed_at, id));
        }
        drop(st);
        Ok((records, if more { last } else { None }))
    }

    async fn requeue_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        let sh = &*self.shared;
        let mut ready: HashMap<Arc<str>, usize> = HashMap::new();
        let (ids, batch) = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let ids = Shared::select_dead(&st, selector);
            let mut ops = Vec::with_capacity(ids.len());
            for id in &ids {
                let seq = st.jobs.next_seq;
                st.jobs.next_seq += 1;
                // Enqueued anew: attempt 1 on the next delivery, enqueue time now, same id;
                // the dedup index is not consulted or written.
                if let Some(m) = st.jobs.update(*id, |m| {
                    m.stage = Stage::Ready;
                    m.seq = seq;
                    m.enqueued_at = now;
                    m.attempt = 0;
                    m.last_reason = None;
                    m.worker_id = None;
                }) {
                    ops.push(meta_put(*id, m));
                    *ready.entry(m.queue.clone()).or_default() += 1;
                }
            }
            let batch = sh.commit.append(ops)?;
            (ids, batch)
        };
        for (q, n) in ready {
            sh.signals.job_ready(&q, n);
        }
        sh.commit.wait(batch).await?;
        Ok(ids)
    }

    async fn delete_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        let sh = &*self.shared;
        let (ids, batch) = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let ids = Shared::select_dead(&st, selector);
            let mut ops = Vec::with_capacity(ids.len() * 2);
            for id in &ids {
                let (failed_at, cause) = match st.jobs.get(*id).map(|m| m.stage) {
                    Some(Stage::Dead { failed_at, cause }) => (failed_at, cause),
                    _ => continue,
                };
                Shared::discard(&mut st, *id, failed_at, Some(cause), now, &mut ops);
            }
            let batch = sh.commit.append(ops)?;
            (ids, batch)
        };
        sh.commit.wait(batch).await?;
        Ok(ids)
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), StorageError> {
        let sh = &*self.shared;
        let (batch, ready) = {
            let mut st = sh.lock();
            sh.commit.check_writable()?;
            let name = st.jobs.intern(&Arc::from(queue));
            let q = st.jobs.queue_mut(&name);
            q.paused = paused;
            let ready = q.ready.len();
            let rec = QueueRecord { paused };
            let batch = sh.commit.append(vec![WriteOp::put(
                Ks::Queues,
                queue.as_bytes(),
                rec.encode(),
            )])?;
            (batch, ready)
        };
        if !paused {
            sh.signals.job_ready(queue, ready);
        }
        sh.commit.wait(batch).await
    }

    async fn queue_stats(&self, queue: &str) -> Result<QueueStats, StorageError> {
        let st = self.shared.lock();
        let q = st.jobs.queue(queue);
        Ok(QueueStats {
            ready: q.map_or(0, |q| q.ready.len() as u64),
            scheduled: q.map_or(0, |q| q.scheduled),
            in_flight: q.map_or(0, |q| q.in_flight),
            dead_lettered: q.map_or(0, |q| q.dead.len() as u64),
            dedup_records: st.dedup.count_for_queue(queue),
            paused: q.is_some_and(|q| q.paused),
        })
    }

    async fn deadline_changed(&self) {
        self.shared.deadline.notified().await;
    }

    fn health(&self) -> tokio::sync::watch::Receiver<StorageHealth> {
        self.shared.commit.health()
    }

    async fn close(&self) -> Result<(), StorageError> {
        self.shared.commit.close();
        let handle = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        match self.shared.keyspaces() {
            Some(ks) => ks
                .db
                .persist(fjall::PersistMode::SyncAll)
                .map_err(|e| StorageError::Io(e.to_string())),
            None => Ok(()),
        }
    }
}

impl EmbeddedStore {
    /// Counts of the job index and the dedup index, for tests and benchmarks.
    pub fn index_sizes(&self) -> (usize, usize) {
        let st = self.shared.lock();
        (st.jobs.len(), st.dedup.len())
    }
}

#[cfg(test)]
mod tests;
