//! Group commit: many concurrent transitions share one journal write and one fsync.
//!
//! Transitions append their writes to the batch being filled (while holding the store's state
//! lock, so batches follow state order) and get that batch's number. One committer at a time
//! takes the whole batch, writes it to fjall as one atomic write batch, makes it durable as the
//! `persist_mode` says, and publishes the batch number. While it commits, the next batch fills;
//! so the more concurrent writers, the more writes each fsync carries. The committer is the
//! first waiter of a batch when nothing else is being committed (a lone writer commits its own
//! write, on its own thread, with no hand-over), and otherwise the flusher thread, which takes
//! each batch that filled during the previous commit.
//!
//! A transition replies only after [`GroupCommit::wait`] sees its batch durable. If a commit
//! fails, every waiter of that batch and of the batch filling meanwhile gets
//! [`StorageError::Unavailable`] (never `Ok`), further writes are refused, and the in-memory
//! index is rebuilt from what fjall committed, so that memory equals disk again. The refusal,
//! the discarding of the filling batch and the rebuild all happen under the store's state lock
//! ([`Engine::rebuild`]): a transition checks [`GroupCommit::check_writable`] and appends under
//! that same lock, so it either appended before the refusal (its batch is discarded and failed,
//! its memory change undone by the rebuild) or sees the refusal before changing anything. That
//! is why [`GroupCommit::append`] cannot fail. After a lack
//! of space (`ENOSPC`) fjall is reopened in-process and writes resume once the free space is back
//! above `storage.min_free_bytes`; after any other failure (an fsync error cannot be retried
//! safely) writes stay refused until a restart. Below the mark, the flusher refuses new writes
//! before the disk is full (checked with `statvfs` after commits and every 200 ms while
//! refusing).

use super::space;
use crate::domain::PersistMode;
use crate::storage::{StorageError, StorageHealth};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// After this long without a write, the flusher seals fjall's memtables, so that they are
/// written out as disk tables and their memory is freed (a memtable otherwise stays resident
/// until it reaches its size bound, however long the store is quiet). It also lets fjall drop
/// the journals those memtables pinned.
const IDLE_SEAL_AFTER: Duration = Duration::from_secs(5);
/// Commits slower than this are logged at debug level.
const SLOW_COMMIT: Duration = Duration::from_millis(20);
/// Below this many bytes of memtables, an idle store is left alone.
const IDLE_SEAL_MIN_BYTES: u64 = 1024 * 1024;

/// The keyspaces of the embedded store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ks {
    /// Bodies of format 1, keyed by job id.
    Jobs,
    /// Bodies of format 2, keyed by enqueue number.
    Bodies,
    Meta,
    /// Dedup records of format 2 and earlier, keyed by queue and idempotency key.
    Dedup,
    /// Dedup records of format 3, keyed by their job's enqueue number.
    DedupLog,
    Queues,
}

/// One put (value set) or delete (value unset).
#[derive(Debug)]
pub(crate) struct WriteOp {
    pub(crate) ks: Ks,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
}

impl WriteOp {
    pub(crate) fn put(ks: Ks, key: impl Into<Vec<u8>>, value: Vec<u8>) -> Self {
        WriteOp {
            ks,
            key: key.into(),
            value: Some(value),
        }
    }
    pub(crate) fn delete(ks: Ks, key: impl Into<Vec<u8>>) -> Self {
        WriteOp {
            ks,
            key: key.into(),
            value: None,
        }
    }
}

/// The fjall handles the flusher writes to.
#[derive(Clone)]
pub(crate) struct Keyspaces {
    pub(crate) db: fjall::Database,
    pub(crate) jobs: fjall::Keyspace,
    pub(crate) bodies: fjall::Keyspace,
    pub(crate) meta: fjall::Keyspace,
    pub(crate) dedup: fjall::Keyspace,
    pub(crate) dedup_log: fjall::Keyspace,
    pub(crate) queues: fjall::Keyspace,
}

impl Keyspaces {
    /// Seals every keyspace's memtable when together they hold at least
    /// [`IDLE_SEAL_MIN_BYTES`]; fjall's flush workers then write them to disk tables.
    fn seal_idle_memtables(&self) {
        let bytes = self.db.write_buffer_size();
        if bytes < IDLE_SEAL_MIN_BYTES {
            return;
        }
        for ks in [
            &self.jobs,
            &self.bodies,
            &self.meta,
            &self.dedup,
            &self.dedup_log,
            &self.queues,
        ] {
            if let Err(e) = ks.rotate_memtable() {
                tracing::warn!(error = %e, "sealing an idle memtable failed");
            }
        }
        tracing::debug!(bytes, "sealed idle memtables");
    }

    pub(crate) fn get(&self, ks: Ks) -> &fjall::Keyspace {
        match ks {
            Ks::Jobs => &self.jobs,
            Ks::Bodies => &self.bodies,
            Ks::Meta => &self.meta,
            Ks::Dedup => &self.dedup,
            Ks::DedupLog => &self.dedup_log,
            Ks::Queues => &self.queues,
        }
    }
}

/// How often the flusher looks at the free space while it refuses writes for lack of it, and
/// at most how often it looks after commits.
const SPACE_PROBE_EVERY: Duration = Duration::from_millis(200);
const SPACE_PROBE_AFTER_COMMITS: Duration = Duration::from_millis(20);
/// With the free-space mark off (`min_free_bytes = 0`), a poisoned engine (a background flush
/// or compaction failed) is taken for a lack of space when less than this is free.
const POISONED_LOW_SPACE: u64 = 8 * 1024 * 1024;

/// What the flusher needs from the store: the current fjall handles, and a way to make the
/// in-memory index equal what fjall holds after a failed commit.
pub(crate) trait Engine: Sync {
    /// The current handles; `None` while fjall is being reopened.
    fn keyspaces(&self) -> Option<Keyspaces>;
    /// Takes the store's state lock, calls `first` under it, then rebuilds the in-memory index
    /// from fjall's committed state (still under that lock).
    fn rebuild(&self, first: &mut dyn FnMut()) -> Result<(), StorageError>;
    /// Drops every fjall handle and opens the directory again, which clears fjall's poisoned
    /// flag (fjall refuses every write once a write failed) and replays its journal: a torn
    /// batch at the tail is discarded. `then` runs on the new handles before anyone else sees
    /// them. All of it under the store's state lock: a reader holding that lock sees either no
    /// handles (and answers "unavailable") or handles to what was committed, never a moment in
    /// between, and never loses its handles while it holds the lock.
    fn reopen(
        &self,
        then: &mut dyn FnMut(&Keyspaces) -> Result<(), StorageError>,
    ) -> Result<(), StorageError>;
}

/// Why writes are refused.
#[derive(Debug, Clone)]
enum Refusal {
    /// Free space is below the mark: new transitions are refused, but ops already appended
    /// (by transitions that passed the check) are still committed, from the headroom.
    LowSpace(String),
    /// A commit failed: nothing more is committed until the store has resynced (after a lack
    /// of space) or ever (another failure).
    Failed(String),
}

impl Refusal {
    fn message(&self) -> &str {
        match self {
            Refusal::LowSpace(m) | Refusal::Failed(m) => m,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Durable {
    batch: u64,
    /// Batch ranges (inclusive) that were discarded by a failed commit, with the reason. A
    /// waiter of one of them gets an error even once later batches are durable.
    failed: Vec<(u64, u64, String)>,
}

impl Durable {
    fn failure(&self, id: u64) -> Option<&str> {
        self.failed
            .iter()
            .find(|(from, to, _)| (*from..=*to).contains(&id))
            .map(|(_, _, why)| why.as_str())
    }
}

#[derive(Debug)]
struct Filling {
    /// The writes of each transition appended to this batch, in order (kept apart, so that an
    /// append moves one vector instead of copying its writes behind the others'); never holds
    /// an empty one.
    ops: Vec<Vec<WriteOp>>,
    /// The number of the batch being filled; batch 0 is "already durable".
    id: u64,
    closing: bool,
    refusal: Option<Refusal>,
    /// A batch is being committed (by the flusher or by a waiter that leads): one at a time,
    /// so batches reach fjall in number order.
    committing: bool,
    /// A leader's commit that failed, for the flusher to handle (it may have to wait for free
    /// space, which a leader on an async worker must not). `committing` stays set meanwhile.
    failed_commit: Option<Box<Failure>>,
    /// When the free space was last looked at after a commit.
    probed: Instant,
    /// Whether the last batch taken held the writes of one transition only: the store is
    /// written by one writer at a time, and a waiter may lead (see [`GroupCommit::lead`]).
    lone: bool,
}

impl Filling {
    /// Takes the filling batch for commit (by the flusher or a leader): marks a commit under
    /// way, notes whether the batch is one transition's, and starts the next batch.
    fn take(&mut self) -> (Vec<Vec<WriteOp>>, u64) {
        self.committing = true;
        self.lone = self.ops.len() == 1;
        let id = self.id;
        self.id += 1;
        (std::mem::take(&mut self.ops), id)
    }
}

/// A commit that failed: what [`GroupCommit::on_commit_failed`] needs.
struct Failure {
    id: u64,
    error: fjall::Error,
    keyspaces: Keyspaces,
    touched: Vec<(Ks, fjall::Slice)>,
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failure")
            .field("id", &self.id)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Where the data lives and how much free space it keeps.
#[derive(Debug, Clone)]
pub(crate) struct SpaceMark {
    pub(crate) dir: PathBuf,
    /// Below this many free bytes new writes are refused; 0 turns the check off.
    pub(crate) min_free_bytes: u64,
}

/// The batch being filled and the durability watermark.
pub(crate) struct GroupCommit {
    filling: Mutex<Filling>,
    /// Signalled when the filling batch gets its first op, or on close. The flusher waits on it.
    work: Condvar,
    /// The last durable batch, on two channels: `durable[p]` moves when a batch whose number
    /// has parity `p` becomes durable, and both carry every failure. At most two batches are
    /// outstanding (the one being committed and the one filling), so a commit wakes only its
    /// own waiters, not those of the batch filling behind it. The flusher is the only sender.
    durable: [watch::Sender<Durable>; 2],
    durable_batch: AtomicU64,
    mode: PersistMode,
    space: SpaceMark,
    health: watch::Sender<StorageHealth>,
    /// Told of each durable commit (the metrics), when set.
    observer: std::sync::OnceLock<std::sync::Arc<dyn crate::storage::CommitObserver>>,
    /// Test-only fault hook: the next commit fails as if the disk had refused it.
    #[cfg(test)]
    pub(crate) fail_next_commit: std::sync::atomic::AtomicBool,
}

enum Next {
    Batch(Vec<Vec<WriteOp>>, u64),
    Failed(Box<Failure>),
    Seal,
    Probe,
}

impl GroupCommit {
    pub(crate) fn new(mode: PersistMode, space: SpaceMark) -> Self {
        GroupCommit {
            filling: Mutex::new(Filling {
                ops: Vec::new(),
                id: 1,
                closing: false,
                refusal: None,
                committing: false,
                failed_commit: None,
                probed: Instant::now(),
                lone: true,
            }),
            work: Condvar::new(),
            durable: [
                watch::Sender::new(Durable::default()),
                watch::Sender::new(Durable::default()),
            ],
            durable_batch: AtomicU64::new(0),
            mode,
            space,
            health: watch::Sender::new(StorageHealth::Serving),
            observer: std::sync::OnceLock::new(),
            #[cfg(test)]
            fail_next_commit: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Records a failed range of batches on both channels (so that every waiter of it wakes).
    fn publish_failure(&self, from: u64, to: u64, why: String) {
        for d in &self.durable {
            d.send_modify(|d| d.failed.push((from, to, why.clone())));
        }
    }

    /// Registers who is told of each durable commit (once; later calls are ignored).
    pub(crate) fn observe(&self, observer: std::sync::Arc<dyn crate::storage::CommitObserver>) {
        let _ = self.observer.set(observer);
    }

    fn lock(&self) -> MutexGuard<'_, Filling> {
        self.filling.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store's health.
    pub(crate) fn health(&self) -> watch::Receiver<StorageHealth> {
        self.health.subscribe()
    }

    fn set_health(&self, h: StorageHealth) {
        self.health.send_if_modified(|cur| {
            let changed = *cur != h;
            *cur = h;
            changed
        });
    }

    /// Appends `ops` to the filling batch and returns its number (0 when `ops` is empty). The
    /// caller then calls [`GroupCommit::wait`] with that number, in the same poll (nothing
    /// awaited in between): that call commits the batch, or the commit under way hands it on.
    ///
    /// Cannot fail: a transition calls it under the store's state lock after
    /// [`GroupCommit::check_writable`] passed under the same lock hold, and a failed commit and
    /// a close only refuse under that lock (see the module docs). A lack of space refuses new
    /// transitions in `check_writable`, but ops already being appended are still committed,
    /// from the headroom. Should a caller break that protocol, its batch is failed at once, so
    /// that its waiter gets an error instead of waiting forever.
    pub(crate) fn append(&self, ops: Vec<WriteOp>) -> u64 {
        if ops.is_empty() {
            return 0;
        }
        let mut f = self.lock();
        let refused = f.closing || matches!(f.refusal, Some(Refusal::Failed(_)));
        debug_assert!(!refused, "append after a refusal: check_writable first");
        if refused {
            let id = f.id;
            f.id += 1;
            drop(f);
            self.publish_failure(id, id, "writes are refused (append after refusal)".into());
            return id;
        }
        f.ops.push(ops);
        f.id
    }

    /// Tells the flusher to commit what is filling: for writes nobody waits for (the sweeper's),
    /// since no caller of [`GroupCommit::wait`] will.
    pub(crate) fn nudge(&self) {
        self.work.notify_one();
    }

    /// Refuses a write transition while writes are refused (too little space, a failed commit,
    /// shutting down). Transitions call it under the store's state lock, before they change
    /// anything.
    pub(crate) fn check_writable(&self) -> Result<(), StorageError> {
        let f = self.lock();
        if let Some(r) = &f.refusal {
            return Err(StorageError::Unavailable(r.message().to_string()));
        }
        if f.closing {
            return Err(StorageError::Unavailable(
                "the server is shutting down".into(),
            ));
        }
        Ok(())
    }

    /// The newest durable batch.
    pub(crate) fn durable_batch(&self) -> u64 {
        self.durable_batch.load(Ordering::Acquire)
    }

    /// Waits until batch `id` is durable.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] if the batch was discarded by a failed commit (its own or
    /// an earlier one's): never `Ok` for a write that did not reach the disk.
    ///
    /// When batch `id` is still filling and no commit is under way, the caller commits it
    /// itself, on its own thread (blocking it for the write and the sync): with few concurrent
    /// writers this saves the hand-over to the flusher thread and back (two thread wake-ups per
    /// write). A commit under way hands a batch that filled meanwhile to the flusher, so under
    /// load the flusher commits back to back and callers only wait, as before.
    pub(crate) async fn wait(&self, id: u64, engine: &dyn Engine) -> Result<(), StorageError> {
        if id == 0 {
            return Ok(());
        }
        if self.durable_batch() < id {
            self.lead(id, engine);
        }
        let mut rx = self.durable[(id % 2) as usize].subscribe();
        let d = rx
            .wait_for(|d| d.batch >= id || d.failure(id).is_some())
            .await
            .map_err(|_| StorageError::Unavailable("the flusher stopped".into()))?;
        match d.failure(id) {
            Some(why) => Err(StorageError::Unavailable(why.to_string())),
            None => Ok(()),
        }
    }

    /// Commits batch `id` on this thread if it is still filling and nothing is being committed.
    fn lead(&self, id: u64, engine: &dyn Engine) {
        let (ops, id) = {
            let mut f = self.lock();
            if f.id != id || f.ops.is_empty() || f.committing || f.failed_commit.is_some() {
                return;
            }
            // Under concurrent writes (the last batch held several), leading would block an
            // async worker for a sync while other requests wait on it; the flusher commits.
            if !(f.ops.len() == 1 && f.lone) {
                drop(f);
                self.work.notify_one();
                return;
            }
            f.take()
        };
        let failed = self.commit(engine, ops, id).err();
        let mut f = self.lock();
        let hand_over = failed.is_some() || !f.ops.is_empty() || f.closing;
        match failed {
            // The flusher handles it; nothing is committed meanwhile.
            Some(failure) => f.failed_commit = Some(failure),
            None => f.committing = false,
        }
        drop(f);
        if hand_over {
            self.work.notify_one();
        }
    }

    /// Writes batch `id` to fjall as one atomic batch, makes it as durable as the mode says
    /// and publishes it. Called by whoever set `committing` (the flusher or a leading waiter).
    fn commit(
        &self,
        engine: &dyn Engine,
        ops: Vec<Vec<WriteOp>>,
        id: u64,
    ) -> Result<(), Box<Failure>> {
        let Some(ks) = engine.keyspaces() else {
            // Only while reopening, when nothing can be appended; never reached.
            self.publish_failure(id, id, "storage is being reopened".to_string());
            return Ok(());
        };
        let mode = match self.mode {
            PersistMode::SyncAll => fjall::PersistMode::SyncAll,
            PersistMode::SyncData => fjall::PersistMode::SyncData,
            PersistMode::Buffer => fjall::PersistMode::Buffer,
        };
        let mut batch = ks.db.batch().durability(Some(mode));
        // The writes go in ordered by keyspace and key. Each memtable insert searches a skip
        // list, and with random job ids nearly every step of an unordered insert misses the
        // CPU cache; in key order, consecutive inserts walk mostly the same nodes (batches of
        // 1,000: 0.83x the server's CPU per job, see docs/benchmarks.md). The sort is stable,
        // so the writes of one key keep their order and the last still wins (module docs, 3).
        let mut ops: Vec<WriteOp> = ops.into_iter().flatten().collect();
        ops.sort_by(|a, b| (a.ks, &a.key).cmp(&(b.ks, &b.key)));
        let writes = ops.len();
        // The keys of the batch, to undo it should it fail and still reach the disk. Each
        // key is made a fjall slice once: the batch and this list share it (a short key is
        // held inline, a longer one counted by reference), instead of a copy of each.
        let mut touched = Vec::with_capacity(writes);
        for op in ops {
            let key = fjall::Slice::from(op.key);
            touched.push((op.ks, key.clone()));
            let keyspace = ks.get(op.ks);
            match op.value {
                Some(v) => batch.insert(keyspace, key, v),
                None => batch.remove(keyspace, key),
            }
        }
        let started = Instant::now();
        #[cfg(test)]
        let injected = self.fail_next_commit.swap(false, Ordering::SeqCst);
        #[cfg(not(test))]
        let injected = false;
        let result = if injected {
            // Not committed at all: as when the disk refuses the write.
            drop(batch);
            Err(fjall::Error::Io(std::io::Error::other(
                "injected commit failure",
            )))
        } else {
            batch.commit()
        };
        let took = started.elapsed();
        if took > SLOW_COMMIT {
            // Usually the commit that meets a memtable rotation (and so a new journal).
            tracing::debug!(
                took_ms = took.as_millis() as u64,
                journals = ks.db.journal_count(),
                outstanding_flushes = ks.db.outstanding_flushes(),
                "slow storage commit"
            );
        }
        match result {
            Ok(()) => {
                drop(ks);
                if let Some(o) = self.observer.get() {
                    o.committed(writes, took);
                }
                self.durable_batch.store(id, Ordering::Release);
                self.durable[(id % 2) as usize].send_modify(|d| d.batch = id);
                let probe = {
                    let mut f = self.lock();
                    let due = f.probed.elapsed() >= SPACE_PROBE_AFTER_COMMITS;
                    if due {
                        f.probed = Instant::now();
                    }
                    due
                };
                if probe {
                    self.probe_space();
                }
                Ok(())
            }
            Err(error) => Err(Box::new(Failure {
                id,
                error,
                keyspaces: ks,
                touched,
            })),
        }
    }

    /// Looks at the free space: below the mark, new writes are refused; back above it (and
    /// not failed), they are taken again.
    fn probe_space(&self) {
        let min = self.space.min_free_bytes;
        let refusing_for_space = matches!(self.lock().refusal, Some(Refusal::LowSpace(_)));
        if min == 0 && !refusing_for_space {
            return;
        }
        // With the mark off, writes refused after an ENOSPC resume above a small floor.
        let resume_at = if min == 0 { POISONED_LOW_SPACE } else { min };
        let free = match space::free_bytes(&self.space.dir) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.space.dir.display(), "cannot read the free space");
                return;
            }
        };
        let mut f = self.lock();
        match (&f.refusal, free >= resume_at) {
            (None, false) if min > 0 => {
                let why = space::no_space_message(&self.space.dir, Some(free), min);
                tracing::error!(free, min_free_bytes = min, dir = %self.space.dir.display(), "free space below storage.min_free_bytes; refusing writes until space is freed");
                f.refusal = Some(Refusal::LowSpace(why.clone()));
                drop(f);
                self.set_health(StorageHealth::Refusing(why));
            }
            (Some(Refusal::LowSpace(_)), true) => {
                tracing::warn!(
                    free,
                    min_free_bytes = min,
                    "free space back above storage.min_free_bytes; taking writes again"
                );
                f.refusal = None;
                drop(f);
                self.set_health(StorageHealth::Serving);
            }
            _ => {}
        }
    }

    /// Waits up to `d` on the work condvar; returns true when the store is closing.
    fn pause(&self, d: Duration) -> bool {
        let f = self.lock();
        if f.closing {
            return true;
        }
        let (f, _) = self
            .work
            .wait_timeout(f, d)
            .unwrap_or_else(|e| e.into_inner());
        f.closing
    }

    /// After a failed commit of batch `id`: refuse, fail every waiter of this and every later
    /// batch, make memory equal what fjall holds, and, after a lack of space, reopen fjall
    /// and wait for the free space to come back. Returns false when the flusher must stop.
    fn on_commit_failed(&self, engine: &dyn Engine, failure: Failure) -> bool {
        let Failure {
            id,
            error,
            keyspaces: failed,
            touched,
        } = failure;
        let e = &error;
        let dir = &self.space.dir;
        let free = space::free_bytes(dir).ok();
        let low = self.space.min_free_bytes.max(POISONED_LOW_SPACE);
        let no_space = space::is_no_space(e)
            || (matches!(e, fjall::Error::Poisoned) && free.is_some_and(|b| b < low));
        let why = if no_space {
            space::no_space_message(dir, free, self.space.min_free_bytes)
        } else {
            format!(
                "storage in {} failed to write ({e}); writes are refused until the server is \
                 restarted",
                dir.display()
            )
        };
        tracing::error!(error = %e, batch = id, no_space, dir = %dir.display(), "storage write failed; refusing writes");
        // Under the store's state lock: refuse, discard the batch filling meanwhile (its
        // transitions changed memory after the failed one, and fjall refuses every write now),
        // fail the waiters of both, then make memory equal what fjall holds (the failed batch
        // never reached its memtables). No transition runs in between.
        // Health turns first, so that a waiter that sees its error also sees the store failed.
        let rebuilt = engine.rebuild(&mut || {
            let last = {
                let mut f = self.lock();
                f.refusal = Some(Refusal::Failed(why.clone()));
                f.ops = Vec::new();
                let last = f.id;
                f.id += 1;
                last
            };
            self.set_health(if no_space {
                StorageHealth::Refusing(why.clone())
            } else {
                StorageHealth::Failed(why.clone())
            });
            self.publish_failure(id, last, why.clone());
        });
        if let Err(e) = rebuilt {
            tracing::error!(error = %e, "rebuilding the index after a failed write failed");
        }
        if !no_space {
            return true;
        }
        // fjall stays poisoned until it is reopened. But its journal writer still buffers the
        // failed batch and writes it out again whenever it flushes (a background flush, the
        // close before the reopen) and space happens to be there: the batch may reach the disk
        // after all. So the committed values of every key it touched are read now, from the
        // poisoned engine (its memtables never got the failed batch), and written back after
        // the reopen: the journal then ends with the undo, whatever came before it.
        let mut undo = Vec::with_capacity(touched.len());
        for (k, key) in touched {
            match failed.get(k).get(&key) {
                Ok(v) => undo.push((k, key, v)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot read what a failed batch touched; refusing writes until restart");
                    let why = format!(
                        "storage in {} failed to write and cannot be read back ({e}); writes \
                         are refused until the server is restarted",
                        dir.display()
                    );
                    self.lock().refusal = Some(Refusal::Failed(why.clone()));
                    self.set_health(StorageHealth::Failed(why));
                    return true;
                }
            }
        }
        // Every handle must go for the reopen. Not before there is room for the undo, though:
        // until then the poisoned handles still read everything committed (paged-out metas
        // included), so reads keep working while the disk is full, and a reopen could only fail
        // and leave the store without handles between attempts.
        let resume_at = self.space.min_free_bytes.max(POISONED_LOW_SPACE);
        while space::free_bytes(dir).is_ok_and(|b| b < resume_at) {
            if self.pause(SPACE_PROBE_EVERY) {
                return false;
            }
        }
        drop(failed);
        loop {
            let undone = engine.reopen(&mut |ks| {
                let mut batch = ks.db.batch().durability(Some(fjall::PersistMode::SyncAll));
                for (k, key, v) in &undo {
                    match v {
                        Some(v) => batch.insert(ks.get(*k), key.clone(), v.clone()),
                        None => batch.remove(ks.get(*k), key.clone()),
                    }
                }
                batch
                    .commit()
                    .map_err(|e| StorageError::Io(format!("undoing the failed batch: {e}")))
            });
            match undone {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reopening storage after a lack of space failed; retrying");
                    if self.pause(SPACE_PROBE_EVERY) {
                        return false;
                    }
                }
            }
        }
        // The reopened journal is what is on disk now; make memory equal it, then refuse only
        // for the lack of space, which the probe clears once space is back.
        let rebuilt = engine.rebuild(&mut || {
            self.lock().refusal = Some(Refusal::LowSpace(why.clone()));
        });
        if let Err(e) = rebuilt {
            tracing::error!(error = %e, "rebuilding the index after reopening storage failed; refusing writes until restart");
            let why = format!(
                "storage in {} could not be reloaded after running out of space ({e}); writes \
                 are refused until the server is restarted",
                dir.display()
            );
            self.lock().refusal = Some(Refusal::Failed(why.clone()));
            self.set_health(StorageHealth::Failed(why));
            return true;
        }
        tracing::info!(dir = %dir.display(), "storage reopened after running out of space; writes resume once free space is back above storage.min_free_bytes");
        true
    }

    /// The flusher loop; runs on its own thread until [`GroupCommit::close`]. It commits the
    /// batches no waiter leads (those that filled during another commit, and unawaited ones),
    /// handles failed commits, seals idle memtables and watches the free space.
    pub(crate) fn run_flusher(&self, engine: &dyn Engine) {
        // Whether anything was written since the memtables were last sealed for idleness, and
        // the durable batch when the flusher last looked (leaders commit without telling it).
        let mut written = false;
        let mut seen = self.durable_batch();
        // Whether the flusher set `committing` for the batch it just handled.
        let mut mine = false;
        self.probe_space();
        loop {
            let next = {
                let mut f = self.lock();
                if std::mem::take(&mut mine) {
                    f.committing = false;
                }
                loop {
                    if let Some(failure) = f.failed_commit.take() {
                        break Next::Failed(failure);
                    }
                    if !f.ops.is_empty() && !f.committing {
                        let (ops, id) = f.take();
                        break Next::Batch(ops, id);
                    }
                    if f.closing && !f.committing {
                        return;
                    }
                    let low_space = matches!(f.refusal, Some(Refusal::LowSpace(_)));
                    let timeout = if low_space {
                        SPACE_PROBE_EVERY
                    } else {
                        IDLE_SEAL_AFTER
                    };
                    let (g, waited) = self
                        .work
                        .wait_timeout(f, timeout)
                        .unwrap_or_else(|e| e.into_inner());
                    f = g;
                    if !waited.timed_out() || !f.ops.is_empty() || f.closing || f.committing {
                        continue;
                    }
                    if low_space {
                        break Next::Probe;
                    }
                    let durable = self.durable_batch();
                    if durable != seen {
                        // Written to in the last period: not quiet yet.
                        seen = durable;
                        written = true;
                    } else if written {
                        break Next::Seal;
                    }
                }
            };
            match next {
                Next::Probe => self.probe_space(),
                Next::Seal => {
                    written = false;
                    if let Some(ks) = engine.keyspaces() {
                        ks.seal_idle_memtables();
                    }
                }
                Next::Batch(ops, id) => {
                    mine = true;
                    if let Err(failure) = self.commit(engine, ops, id)
                        && !self.on_commit_failed(engine, *failure)
                    {
                        return;
                    }
                }
                Next::Failed(failure) => {
                    // A leader's: `committing` is still set for it.
                    mine = true;
                    if !self.on_commit_failed(engine, *failure) {
                        return;
                    }
                }
            }
        }
    }

    /// Asks the flusher to write what is pending and stop.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.work.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// An engine over fixed fjall handles, in a temporary directory.
    struct Fixed(Keyspaces, tempfile::TempDir);

    impl Fixed {
        fn open() -> Self {
            let dir = tempfile::tempdir().expect("temp dir");
            let db = fjall::Database::builder(dir.path())
                .manual_journal_persist(true)
                .open()
                .expect("open");
            let ks = |name: &str| {
                db.keyspace(name, fjall::KeyspaceCreateOptions::default)
                    .expect("keyspace")
            };
            let keyspaces = Keyspaces {
                jobs: ks("jobs"),
                bodies: ks("bodies"),
                meta: ks("meta"),
                dedup: ks("dedup"),
                dedup_log: ks("dedup_log"),
                queues: ks("queues"),
                db: db.clone(),
            };
            Fixed(keyspaces, dir)
        }
    }

    impl Engine for Fixed {
        fn keyspaces(&self) -> Option<Keyspaces> {
            Some(self.0.clone())
        }
        fn rebuild(&self, then: &mut dyn FnMut()) -> Result<(), StorageError> {
            then();
            Ok(())
        }
        fn reopen(
            &self,
            then: &mut dyn FnMut(&Keyspaces) -> Result<(), StorageError>,
        ) -> Result<(), StorageError> {
            then(&self.0)
        }
    }

    /// A lone writer commits its own batch: with no flusher thread at all, its wait still ends
    /// with the write in fjall, and the next batch is numbered after it.
    #[tokio::test]
    async fn a_lone_writer_commits_its_own_batch_without_the_flusher() {
        let engine = Fixed::open();
        let commit = GroupCommit::new(
            PersistMode::SyncAll,
            SpaceMark {
                dir: engine.1.path().to_path_buf(),
                min_free_bytes: 0,
            },
        );
        for i in 0u32..3 {
            let batch = commit.append(vec![WriteOp::put(
                Ks::Jobs,
                i.to_be_bytes().to_vec(),
                vec![1; 8],
            )]);
            assert_eq!(batch, u64::from(i) + 1);
            tokio::time::timeout(Duration::from_secs(30), commit.wait(batch, &engine))
                .await
                .expect("the writer's own wait commits its batch, with no flusher running")
                .expect("durable");
            assert_eq!(commit.durable_batch(), batch);
            let v = engine.0.jobs.get(i.to_be_bytes()).expect("get");
            assert_eq!(v.as_deref(), Some(&[1u8; 8][..]));
        }
    }

    /// A store that goes quiet gets its memtables written out and their memory freed, instead
    /// of holding them until they reach their size bound.
    #[test]
    fn idle_flusher_seals_memtables_after_quiet_period() {
        let engine = Fixed::open();
        let (keyspaces, db) = (engine.0.clone(), engine.0.db.clone());
        let commit = Arc::new(GroupCommit::new(
            PersistMode::Buffer,
            SpaceMark {
                dir: engine.1.path().to_path_buf(),
                min_free_bytes: 0,
            },
        ));
        let engine = Arc::new(engine);
        let flusher = {
            let (commit, engine) = (commit.clone(), engine.clone());
            std::thread::spawn(move || commit.run_flusher(&*engine))
        };
        // About 4 MiB in memtables: well over IDLE_SEAL_MIN_BYTES.
        let ops = (0u32..4096)
            .map(|i| WriteOp::put(Ks::Jobs, i.to_be_bytes().to_vec(), vec![7; 1024]))
            .collect();
        let batch = commit.append(ops);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(commit.wait(batch, &*engine)).expect("durable");
        let before = db.write_buffer_size();
        assert!(
            before >= IDLE_SEAL_MIN_BYTES,
            "memtables hold {before} bytes"
        );

        let deadline = Instant::now() + IDLE_SEAL_AFTER + Duration::from_secs(10);
        while db.write_buffer_size() >= IDLE_SEAL_MIN_BYTES {
            assert!(
                Instant::now() < deadline,
                "memtables still hold {} bytes {} s after the last write",
                db.write_buffer_size(),
                (IDLE_SEAL_AFTER + Duration::from_secs(10)).as_secs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Written out, not lost.
        let v = keyspaces.jobs.get(7u32.to_be_bytes()).expect("get");
        assert_eq!(v.as_deref(), Some(&[7u8; 1024][..]));
        commit.close();
        flusher.join().expect("flusher");
    }
}
