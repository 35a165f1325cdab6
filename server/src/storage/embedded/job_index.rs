//! The in-memory job index of the embedded store: the ordered sets that answer "next ready job
//! of this queue", "next lease to expire", "next scheduled job due" and "oldest dead letter"
//! without scanning, and the [`Meta`] of the jobs the hot path touches. Rebuilt from the `meta`
//! keyspace at start-up. Payloads are not held here; they stay on disk.
//!
//! # What stays in memory
//!
//! A ready or scheduled job is only a key in its ordered sets (32 bytes each): its `Meta` is
//! paged out to the `meta` keyspace, which holds it anyway, and read back when a transition or
//! an inspection needs it. Every other job (in flight, dead letter, tombstone) keeps its `Meta`
//! in memory: leases are the hot path, and dead letters and tombstones are few and bounded by
//! retention.
//!
//! A paged-out meta is read from disk, so the disk must hold the current one. A change is on
//! disk only once its batch is durable; until then the changed job stays *held* (its `Meta`
//! in memory, or a marker that it was removed), tagged with the batch that writes it
//! ([`JobIndex::seal`], called after each append). Once that batch is durable, a ready or
//! scheduled job is paged out again. A failed batch never pages anything out: the group commit
//! rebuilds the whole index from disk under the same lock.

use super::codec::{Meta, Stage};
use super::group_commit::Keyspaces;
use crate::domain::{JobCursor, JobId, ListState, UnixMs};
use crate::storage::StorageError;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, RwLock};

/// The fjall handles of the store, shared with it (`None` while fjall is reopened after a lack
/// of space): where paged-out metas are read. A handle, not a copy of the keyspace, because
/// reopening fjall needs every copy gone.
pub(crate) type SharedKeyspaces = Arc<RwLock<Option<Keyspaces>>>;

/// Whether a job in `stage` may be paged out of memory once its last change is durable.
fn pageable(stage: Stage) -> bool {
    matches!(stage, Stage::Ready | Stage::Scheduled { .. })
}

/// A job whose state is in memory.
#[derive(Debug)]
struct Held {
    /// `None`: removed, and the removal is not durable yet (the disk still holds the old meta).
    meta: Option<Meta>,
    /// The batch that writes its last change; [`UNSEALED`] until the change is appended.
    batch: u64,
}

/// The batch tag of a change not appended yet.
const UNSEALED: u64 = u64::MAX;

/// Hashes a [`JobId`] by its low 64 bits, which are random ([`JobId::ordered`]: the high half
/// is a creation stamp): chosen by the server, never by clients, so they are already uniformly
/// spread and cannot be picked to collide; SipHash would only cost time on the hottest map of
/// the server. One multiplication by an odd constant spreads them over the top bits too:
/// hashbrown takes its 7-bit tags from there, where the low half holds the UUID's fixed
/// variant bits, and the low bits (the bucket) stay those of the id's low bits alone.
#[derive(Default)]
pub(crate) struct JobIdHasher(u64);

impl Hasher for JobIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached through `write_u128` below in practice; fold anything else.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type JobMap<V> = HashMap<JobId, V, BuildHasherDefault<JobIdHasher>>;

/// How many maps [`ShardedJobMap`] spreads its jobs over.
const SHARDS: usize = 64;

/// A [`JobMap`] spread over [`SHARDS`] maps by bits 32-37 of the job id: random bits
/// ([`JobId::ordered`]) that the maps' buckets do not depend on (those are the hash's low bits,
/// which come from the id's low bits alone), so that growing it copies a sixty-fourth of the
/// jobs at a time. Not the high half: that is a creation stamp, whose low bits are a counter
/// that stays 0 while jobs come less often than one per millisecond. A single map of
/// a million held jobs (tombstones of keyed jobs, kept for their dedup window) stopped every
/// transition for about a second each time it doubled, under the store's lock.
struct ShardedJobMap<V> {
    shards: Box<[JobMap<V>]>,
}

impl<V> Default for ShardedJobMap<V> {
    fn default() -> Self {
        ShardedJobMap {
            shards: (0..SHARDS).map(|_| JobMap::default()).collect(),
        }
    }
}

impl<V> ShardedJobMap<V> {
    fn shard_of(id: &JobId) -> usize {
        ((id.0 >> 32) as usize) % SHARDS
    }
    fn shard(&self, id: &JobId) -> &JobMap<V> {
        &self.shards[Self::shard_of(id)]
    }
    fn shard_mut(&mut self, id: &JobId) -> &mut JobMap<V> {
        &mut self.shards[Self::shard_of(id)]
    }
    fn get(&self, id: &JobId) -> Option<&V> {
        self.shard(id).get(id)
    }
    fn get_mut(&mut self, id: &JobId) -> Option<&mut V> {
        self.shard_mut(id).get_mut(id)
    }
    #[cfg(test)]
    fn contains_key(&self, id: &JobId) -> bool {
        self.shard(id).contains_key(id)
    }
    fn insert(&mut self, id: JobId, v: V) -> Option<V> {
        self.shard_mut(&id).insert(id, v)
    }
    fn remove(&mut self, id: &JobId) -> Option<V> {
        self.shard_mut(id).remove(id)
    }
    fn entry(&mut self, id: JobId) -> std::collections::hash_map::Entry<'_, JobId, V> {
        self.shard_mut(&id).entry(id)
    }
    fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (&JobId, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }
    /// Shrinks each shard that is at most a quarter full.
    fn shrink_if_sparse(&mut self) {
        for s in self.shards.iter_mut() {
            if s.capacity() > 1024 && s.capacity() > s.len() * 4 {
                s.shrink_to_fit();
            }
        }
    }
}

/// The hasher of the maps keyed by queue and job type names: foldhash, seeded at random per
/// process. SipHash cost several times as much on the enqueue path, where each job looks its
/// queue and type up; these maps hold at most `limits.max_queues` queues (and the job types
/// in use), so they need no more resistance to chosen keys than foldhash's random seed gives.
pub(crate) type NameHasher = foldhash::fast::RandomState;

/// Order of ready jobs within a queue: highest priority first, then enqueue order.
pub(crate) type ReadyKey = (u8, u64, JobId);

fn ready_key(id: JobId, m: &Meta) -> ReadyKey {
    (9u8.saturating_sub(m.priority), m.seq, id)
}

/// One queue's share of the index.
#[derive(Debug, Default)]
pub(crate) struct QueueIndex {
    pub(crate) ready: BTreeSet<ReadyKey>,
    /// Scheduled jobs of this queue, soonest first (for listing).
    pub(crate) scheduled: BTreeSet<(UnixMs, JobId)>,
    /// Leased jobs of this queue, the lease ending soonest first (for listing).
    pub(crate) in_flight: BTreeSet<(UnixMs, JobId)>,
    /// Dead letters of this queue, oldest first.
    pub(crate) dead: BTreeSet<(UnixMs, JobId)>,
    pub(crate) paused: bool,
}

impl QueueIndex {
    /// The id of the ready job enqueued earliest: the first of each priority band, the
    /// earliest of those (at most ten look-ups).
    pub(crate) fn oldest_ready(&self) -> Option<JobId> {
        let mut best: Option<ReadyKey> = None;
        let mut next = self.ready.first().copied();
        while let Some(k) = next {
            if best.is_none_or(|b| k.1 < b.1) {
                best = Some(k);
            }
            next = match k.0.checked_add(1) {
                Some(band) => self.ready.range((band, 0, JobId(0))..).next().copied(),
                None => None,
            };
        }
        best.map(|k| k.2)
    }

    /// Jobs counted against `max_queue_depth`: ready + scheduled + in flight.
    pub(crate) fn depth(&self) -> u64 {
        (self.ready.len() + self.scheduled.len() + self.in_flight.len()) as u64
    }
}

/// The smallest size of the job type set at which an insert prunes it.
const JOB_TYPES_PRUNE_AT: usize = 256;

/// All jobs and their orderings.
#[derive(Default)]
pub(crate) struct JobIndex {
    /// The jobs whose state is in memory (see the module docs).
    held: ShardedJobMap<Held>,
    /// Paged-out metas read during the current lock hold, so that a transition that reads a
    /// job before changing it reads the disk once. Emptied by [`JobIndex::seal`]; always equal
    /// to the disk, because every change takes its job out of here first.
    read_cache: RefCell<JobMap<Meta>>,
    /// Jobs changed since the last [`JobIndex::seal`].
    touched: Vec<JobId>,
    /// Held jobs by the batch that writes them, oldest first, for paging out.
    written: VecDeque<(u64, JobId)>,
    /// Where paged-out metas are; `None`: nothing is paged out.
    disk: Option<SharedKeyspaces>,
    /// Jobs (any stage).
    live: usize,
    queues: HashMap<Arc<str>, QueueIndex, NameHasher>,
    scheduled: BTreeSet<(UnixMs, JobId)>,
    leases: BTreeSet<(UnixMs, JobId)>,
    dead: BTreeSet<(UnixMs, JobId)>,
    tombstones: BTreeSet<(UnixMs, JobId)>,
    /// Job type names, shared by every job of a type held in memory. A name no job holds any
    /// more is dropped at the next prune ([`JobIndex::intern_job_type`]), so the set is at most
    /// twice the types in use (and [`JOB_TYPES_PRUNE_AT`]), not every type ever seen.
    job_types: std::collections::HashSet<Arc<str>, NameHasher>,
    /// The set's size at which the next insert prunes it.
    job_types_prune_at: usize,
    /// The next enqueue sequence number.
    pub(crate) next_seq: u64,
}

impl std::fmt::Debug for JobIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobIndex")
            .field("live", &self.live)
            .field("held", &self.held.len())
            .field("queues", &self.queues.len())
            .finish_non_exhaustive()
    }
}

impl JobIndex {
    /// An empty index whose ready and scheduled jobs are paged out to `disk`.
    pub(crate) fn paged(disk: SharedKeyspaces) -> Self {
        JobIndex {
            disk: Some(disk),
            ..JobIndex::default()
        }
    }

    /// Job `id`'s meta: from memory, or read from the `meta` keyspace if it is paged out. For
    /// transitions, which run only while storage is writable: a read that fails (an I/O error)
    /// is logged and answers `None`, so the transition leaves the job as it is. Inspections use
    /// [`JobIndex::try_get`], which reports the failure.
    pub(crate) fn get(&self, id: JobId) -> Option<Cow<'_, Meta>> {
        self.try_get(id).unwrap_or_else(|e| {
            tracing::error!(job_id = %id, error = %e, "cannot read a job's meta");
            None
        })
    }

    /// Job `id`'s meta, like [`JobIndex::get`], but a paged-out meta that cannot be read is an
    /// error, never "no such job".
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] while storage is reopened after running out of space;
    /// [`StorageError::Io`] or a decode error if the read fails.
    pub(crate) fn try_get(&self, id: JobId) -> Result<Option<Cow<'_, Meta>>, StorageError> {
        if let Some(h) = self.held.get(&id) {
            return Ok(h.meta.as_ref().map(Cow::Borrowed));
        }
        if let Some(m) = self.read_cache.borrow().get(&id) {
            return Ok(Some(Cow::Owned(m.clone())));
        }
        let Some(m) = self.read(id)? else {
            return Ok(None);
        };
        self.read_cache.borrow_mut().insert(id, m.clone());
        Ok(Some(Cow::Owned(m)))
    }

    /// Reads a paged-out meta from disk, its names shared with the index's.
    fn read(&self, id: JobId) -> Result<Option<Meta>, StorageError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(None);
        };
        let found = {
            let ks = disk.read().unwrap_or_else(|e| e.into_inner());
            let Some(ks) = ks.as_ref() else {
                return Err(StorageError::Unavailable(
                    "storage is being reopened after running out of space".into(),
                ));
            };
            ks.meta.get(id.to_bytes())
        };
        let bytes = match found {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(None),
            Err(e) => return Err(StorageError::Io(format!("reading job {id}'s meta: {e}"))),
        };
        let mut m = Meta::decode(&bytes)?;
        if let Some((q, _)) = self.queues.get_key_value(&*m.queue) {
            m.queue = q.clone();
        }
        if let Some(t) = self.job_types.get(&*m.job_type) {
            m.job_type = t.clone();
        }
        Ok(Some(m))
    }

    /// Takes job `id`'s meta out for a change (from memory, the read cache or the disk),
    /// leaving a removal marker in its place.
    fn take(&mut self, id: JobId) -> Option<Meta> {
        if let Some(h) = self.held.get_mut(&id) {
            return h.meta.take();
        }
        let m = match self.read_cache.get_mut().remove(&id) {
            Some(m) => m,
            None => match self.read(id) {
                Ok(m) => m?,
                Err(e) => {
                    tracing::error!(job_id = %id, error = %e, "cannot read a job's meta");
                    return None;
                }
            },
        };
        self.held.insert(
            id,
            Held {
                meta: None,
                batch: UNSEALED,
            },
        );
        Some(m)
    }

    /// Puts a changed meta back (held until its batch is durable).
    fn hold(&mut self, id: JobId, meta: Option<Meta>) {
        let h = self.held.entry(id).or_insert(Held {
            meta: None,
            batch: UNSEALED,
        });
        h.meta = meta;
        h.batch = UNSEALED;
        self.touched.push(id);
    }

    /// Tags the jobs changed since the last call with `batch`, the batch their writes were just
    /// appended to (0: nothing was appended; they stay unsealed), and pages out the ready and
    /// scheduled jobs whose last change is in a batch up to `durable`. Called under the state
    /// lock after each append.
    pub(crate) fn seal(&mut self, batch: u64, durable: u64) {
        if batch != 0 {
            for id in self.touched.drain(..) {
                if let Some(h) = self.held.get_mut(&id) {
                    h.batch = batch;
                    self.written.push_back((batch, id));
                }
            }
        }
        self.read_cache.get_mut().clear();
        if self.disk.is_none() {
            self.written.clear();
            return;
        }
        while let Some(&(b, id)) = self.written.front() {
            if b > durable {
                break;
            }
            self.written.pop_front();
            if let std::collections::hash_map::Entry::Occupied(e) = self.held.entry(id)
                && e.get().batch == b
                && e.get().meta.as_ref().is_none_or(|m| pageable(m.stage))
            {
                e.remove();
            }
        }
    }

    /// Every queue's share of the index, in no order.
    pub(crate) fn queues(&self) -> impl Iterator<Item = (&Arc<str>, &QueueIndex)> {
        self.queues.iter()
    }

    pub(crate) fn queue(&self, name: &str) -> Option<&QueueIndex> {
        self.queues.get(name)
    }

    pub(crate) fn queue_mut(&mut self, name: &Arc<str>) -> &mut QueueIndex {
        queue_entry(&mut self.queues, name)
    }

    /// The interned name of `queue`, so that every job of a queue shares one allocation.
    pub(crate) fn intern(&mut self, queue: &Arc<str>) -> Arc<str> {
        match self.queues.get_key_value(&**queue) {
            Some((k, _)) => k.clone(),
            None => {
                self.queues.insert(queue.clone(), QueueIndex::default());
                queue.clone()
            }
        }
    }

    /// The shared copy of a job type name.
    pub(crate) fn intern_job_type(&mut self, job_type: &str) -> Arc<str> {
        if let Some(t) = self.job_types.get(job_type) {
            return t.clone();
        }
        if self.job_types.len() >= self.job_types_prune_at.max(JOB_TYPES_PRUNE_AT) {
            // Names only the set holds: no job in memory has the type now (a paged-out job
            // takes the shared name again when it is read back, if it is still here).
            self.job_types.retain(|t| Arc::strong_count(t) > 1);
            self.job_types_prune_at = self.job_types.len() * 2;
        }
        let t: Arc<str> = Arc::from(job_type);
        self.job_types.insert(t.clone());
        t
    }

    /// How many job type names the index shares, for tests.
    #[cfg(test)]
    pub(crate) fn job_type_count(&self) -> usize {
        self.job_types.len()
    }

    pub(crate) fn depth(&self, queue: &str) -> u64 {
        self.queues.get(queue).map_or(0, QueueIndex::depth)
    }

    /// How many queues the index holds.
    pub(crate) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Removes a queue's share of the index (its jobs must be gone; tombstones may stay).
    pub(crate) fn remove_queue(&mut self, name: &str) -> Option<QueueIndex> {
        self.queues.remove(name)
    }

    /// Adds a job (new or recovered) and files it under its stage. A tombstone does not create
    /// its queue (the queue may have been deleted since the job finished): it shares the
    /// queue's name only while the queue exists.
    /// Adds a new job (`id` must be one the index does not hold) and files it under its stage.
    /// Its meta is held until [`JobIndex::seal`] sees its batch durable.
    pub(crate) fn insert(&mut self, id: JobId, meta: Meta) {
        let meta = self.file(id, meta);
        if let Some(old) = self.held.get_mut(&id).and_then(|h| h.meta.take()) {
            self.unplace(id, &old);
            self.live -= 1;
        }
        self.hold(id, Some(meta));
    }

    /// Adds a job read from disk at start-up: a ready or scheduled one only as keys in its
    /// ordered sets, any other with its meta.
    pub(crate) fn recover(&mut self, id: JobId, meta: Meta) {
        let meta = self.file(id, meta);
        if self.disk.is_none() || !pageable(meta.stage) {
            self.held.insert(
                id,
                Held {
                    meta: Some(meta),
                    batch: 0,
                },
            );
        }
    }

    /// Interns `meta`'s names, advances the sequence and files the job in its ordered sets.
    /// A tombstone does not create its queue (the queue may have been deleted since the job
    /// finished): it shares the queue's name only while the queue exists.
    fn file(&mut self, id: JobId, mut meta: Meta) -> Meta {
        meta.queue = match meta.stage {
            Stage::Tombstone { .. } => match self.queues.get_key_value(&*meta.queue) {
                Some((k, _)) => k.clone(),
                None => meta.queue,
            },
            _ => self.intern(&meta.queue),
        };
        meta.job_type = self.intern_job_type(&meta.job_type);
        // A body keeps the number it was stored under when its job gets a new `seq`, which is
        // always a later one; counted anyway, so that no new body can land on a live one.
        let last = meta.seq.max(meta.body_seq.unwrap_or(0));
        self.next_seq = self.next_seq.max(last.saturating_add(1));
        self.place(id, &meta);
        self.live += 1;
        meta
    }

    /// Removes a job entirely.
    pub(crate) fn remove(&mut self, id: JobId) -> Option<Meta> {
        let meta = self.take(id)?;
        self.unplace(id, &meta);
        self.live -= 1;
        if self.disk.is_some() {
            self.hold(id, None);
        } else {
            self.held.remove(&id);
        }
        Some(meta)
    }

    /// Changes a job with `f`, keeping every ordered set in step. Returns the updated meta.
    pub(crate) fn update(&mut self, id: JobId, f: impl FnOnce(&mut Meta)) -> Option<&Meta> {
        let mut meta = self.take(id)?;
        self.unplace(id, &meta);
        f(&mut meta);
        self.place(id, &meta);
        self.hold(id, Some(meta));
        self.held.get(&id).and_then(|h| h.meta.as_ref())
    }

    /// The next ready job of `queue`, if any.
    pub(crate) fn first_ready(&self, queue: &str) -> Option<JobId> {
        self.queues
            .get(queue)
            .and_then(|q| q.ready.first())
            .map(|k| k.2)
    }

    pub(crate) fn first_lease(&self) -> Option<(UnixMs, JobId)> {
        self.leases.first().copied()
    }

    /// Every job in flight, by lease expiry (an operator's release of a worker's leases scans
    /// them).
    pub(crate) fn leased(&self) -> impl Iterator<Item = JobId> + '_ {
        self.leases.iter().map(|(_, id)| *id)
    }

    pub(crate) fn first_scheduled(&self) -> Option<(UnixMs, JobId)> {
        self.scheduled.first().copied()
    }

    pub(crate) fn first_tombstone(&self) -> Option<(UnixMs, JobId)> {
        self.tombstones.first().copied()
    }

    /// Dead letters oldest first, of one queue or all, starting after `after` (a paging
    /// cursor) when given.
    pub(crate) fn dead_letters<'a>(
        &'a self,
        queue: Option<&str>,
        after: Option<(UnixMs, JobId)>,
    ) -> Box<dyn Iterator<Item = (UnixMs, JobId)> + 'a> {
        use std::ops::Bound::{Excluded, Unbounded};
        let set = match queue {
            Some(q) => match self.queues.get(q) {
                Some(qi) => &qi.dead,
                None => return Box::new(std::iter::empty()),
            },
            None => &self.dead,
        };
        match after {
            Some(c) => Box::new(set.range((Excluded(c), Unbounded)).copied()),
            None => Box::new(set.iter().copied()),
        }
    }

    pub(crate) fn first_dead(&self) -> Option<(UnixMs, JobId)> {
        self.dead.first().copied()
    }

    /// Every queue name the index holds (any job, or a pause record), in no order.
    pub(crate) fn queue_names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.queues.keys()
    }

    /// The jobs of `queue` in `state`, in that state's order, after `after` when given.
    pub(crate) fn listing<'a>(
        &'a self,
        queue: &str,
        state: ListState,
        after: Option<JobCursor>,
    ) -> Box<dyn Iterator<Item = JobCursor> + 'a> {
        use std::ops::Bound::{Excluded, Unbounded};
        let Some(q) = self.queues.get(queue) else {
            return Box::new(std::iter::empty());
        };
        let timed =
            |set: &'a BTreeSet<(UnixMs, JobId)>| -> Box<dyn Iterator<Item = JobCursor> + 'a> {
                let it = match after {
                    Some((t, _, id)) => set.range((Excluded((t, id)), Unbounded)),
                    None => set.range(..),
                };
                Box::new(it.map(|&(t, id)| (t, 0, id)))
            };
        match state {
            ListState::Ready => {
                let it = match after {
                    Some((p, seq, id)) => q.ready.range((
                        Excluded((u8::try_from(p).unwrap_or(u8::MAX), seq, id)),
                        Unbounded,
                    )),
                    None => q.ready.range(..),
                };
                Box::new(it.map(|&(p, seq, id)| (i64::from(p), seq, id)))
            }
            ListState::Scheduled => timed(&q.scheduled),
            ListState::InFlight => timed(&q.in_flight),
            ListState::DeadLettered => timed(&q.dead),
        }
    }

    /// Shrinks the maps after a large purge so that memory comes back. Called once a sweep has
    /// caught up, not per removal: rehashing a large table holds the store's lock.
    pub(crate) fn shrink_if_sparse(&mut self) {
        self.held.shrink_if_sparse();
    }

    /// Jobs (any stage).
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Jobs whose meta is in memory (removal markers included), for tests and benchmarks.
    #[cfg(test)]
    pub(crate) fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Whether job `id`'s meta is in memory, for tests.
    #[cfg(test)]
    pub(crate) fn holds(&self, id: JobId) -> bool {
        self.held.contains_key(&id)
    }

    /// Every job and its meta, in no order (tests compare memory with disk): the held ones as
    /// held, the paged-out ones as the disk holds them, each checked against the ordered set
    /// that holds its key.
    ///
    /// # Panics
    /// If a job is filed in no set or in a set its meta does not name, or a paged-out job's
    /// meta cannot be read.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> Vec<(JobId, Meta)> {
        let mut out: Vec<(JobId, Meta)> = self
            .held
            .iter()
            .filter_map(|(id, h)| h.meta.clone().map(|m| (*id, m)))
            .collect();
        for (name, q) in &self.queues {
            let ready = q.ready.iter().map(|k| k.2);
            let scheduled = q.scheduled.iter().map(|k| k.1);
            for id in ready.chain(scheduled) {
                if self.held.contains_key(&id) {
                    continue;
                }
                let m = self
                    .read(id)
                    .expect("a paged-out job's meta can be read")
                    .expect("a paged-out job's meta is on disk");
                assert_eq!(&m.queue, name, "job {id} filed under another queue");
                match m.stage {
                    Stage::Ready => assert!(q.ready.contains(&ready_key(id, &m))),
                    Stage::Scheduled { due } => {
                        assert!(q.scheduled.contains(&(due, id)));
                        assert!(self.scheduled.contains(&(due, id)));
                    }
                    _ => panic!("a paged-out job {id} is neither ready nor scheduled"),
                }
                out.push((id, m));
            }
        }
        for (id, m) in out.iter().filter(|(id, _)| self.held.contains_key(id)) {
            let filed = match m.stage {
                Stage::Ready => self
                    .queues
                    .get(&m.queue)
                    .is_some_and(|q| q.ready.contains(&ready_key(*id, m))),
                Stage::Scheduled { due } => self
                    .queues
                    .get(&m.queue)
                    .is_some_and(|q| q.scheduled.contains(&(due, *id))),
                Stage::InFlight { expires } => self.leases.contains(&(expires, *id)),
                Stage::Dead { failed_at, .. } => self.dead.contains(&(failed_at, *id)),
                Stage::Tombstone { until, .. } => self.tombstones.contains(&(until, *id)),
            };
            assert!(filed, "job {id} is not filed under its stage");
        }
        assert_eq!(
            out.len(),
            self.live,
            "the job count differs from the jobs held"
        );
        out
    }

    /// Every queue and whether it is paused (tests compare memory with disk).
    #[cfg(test)]
    pub(crate) fn paused(&self) -> impl Iterator<Item = (&Arc<str>, bool)> {
        self.queues.iter().map(|(q, i)| (q, i.paused))
    }

    fn place(&mut self, id: JobId, m: &Meta) {
        if let Stage::Tombstone { until, .. } = m.stage {
            self.tombstones.insert((until, id));
            return;
        }
        let q = queue_entry(&mut self.queues, &m.queue);
        match m.stage {
            Stage::Ready => {
                q.ready.insert(ready_key(id, m));
            }
            Stage::Scheduled { due } => {
                q.scheduled.insert((due, id));
                self.scheduled.insert((due, id));
            }
            Stage::InFlight { expires } => {
                q.in_flight.insert((expires, id));
                self.leases.insert((expires, id));
            }
            Stage::Dead { failed_at, .. } => {
                q.dead.insert((failed_at, id));
                self.dead.insert((failed_at, id));
            }
            Stage::Tombstone { .. } => {}
        }
    }

    fn unplace(&mut self, id: JobId, m: &Meta) {
        if let Stage::Tombstone { until, .. } = m.stage {
            self.tombstones.remove(&(until, id));
            return;
        }
        let Some(q) = self.queues.get_mut(&m.queue) else {
            return;
        };
        match m.stage {
            Stage::Ready => {
                q.ready.remove(&ready_key(id, m));
            }
            Stage::Scheduled { due } => {
                q.scheduled.remove(&(due, id));
                self.scheduled.remove(&(due, id));
            }
            Stage::InFlight { expires } => {
                q.in_flight.remove(&(expires, id));
                self.leases.remove(&(expires, id));
            }
            Stage::Dead { failed_at, .. } => {
                q.dead.remove(&(failed_at, id));
                self.dead.remove(&(failed_at, id));
            }
            Stage::Tombstone { .. } => {}
        }
    }
}

/// The share of `name` in `queues`, created when missing. Looked up by name first: the usual
/// case, an existing queue, neither clones the name nor hashes it twice.
fn queue_entry<'a>(
    queues: &'a mut HashMap<Arc<str>, QueueIndex, NameHasher>,
    name: &Arc<str>,
) -> &'a mut QueueIndex {
    if !queues.contains_key(&**name) {
        queues.insert(name.clone(), QueueIndex::default());
    }
    queues.get_mut(&**name).expect("just inserted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_at_a_low_rate_still_spread_over_every_shard() {
        // One id per 10 ms, in a future no other call has reached: the stamp's counter (the
        // high half's low 12 bits) stays 0, which is why shards are not picked from there.
        let ids: Vec<JobId> = (0..6400)
            .map(|i| JobId::ordered(4_000_000_000_000 + i * 10))
            .collect();
        assert!(ids.iter().all(|id| (id.0 >> 64) & 0xfff == 0));
        let mut counts = [0usize; SHARDS];
        for id in &ids {
            counts[ShardedJobMap::<()>::shard_of(id)] += 1;
        }
        // 100 each on average; a uniform spread stays well inside 50-150.
        assert!(
            counts.iter().all(|&n| (50..=150).contains(&n)),
            "{counts:?}"
        );
        // And a map of them holds and finds each.
        let mut map = ShardedJobMap::default();
        for (i, id) in ids.iter().enumerate() {
            map.insert(*id, i);
        }
        assert_eq!(map.len(), ids.len());
        assert!(
            ids.iter()
                .enumerate()
                .all(|(i, id)| map.get(id) == Some(&i))
        );
    }
}
