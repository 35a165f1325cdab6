//! The in-memory job index of the embedded store: every job's [`Meta`] plus the ordered sets
//! that answer "next ready job of this queue", "next lease to expire", "next scheduled job due"
//! and "oldest dead letter" without scanning. Rebuilt from the `meta` keyspace at start-up.
//! Payloads are not held here; they stay on disk.

use super::codec::{Meta, Stage};
use crate::domain::{JobCursor, JobId, ListState, UnixMs};
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Hashes a [`JobId`] by its low 64 bits. Ids are random UUIDs chosen by the server, never by
/// clients, so they are already uniformly spread and cannot be picked to collide; SipHash would
/// only cost time on the hottest map of the server.
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
        self.0 = v as u64;
    }
}

type JobMap<V> = HashMap<JobId, V, BuildHasherDefault<JobIdHasher>>;

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

/// All jobs and their orderings.
#[derive(Debug, Default)]
pub(crate) struct JobIndex {
    jobs: JobMap<Meta>,
    queues: HashMap<Arc<str>, QueueIndex, NameHasher>,
    scheduled: BTreeSet<(UnixMs, JobId)>,
    leases: BTreeSet<(UnixMs, JobId)>,
    dead: BTreeSet<(UnixMs, JobId)>,
    tombstones: BTreeSet<(UnixMs, JobId)>,
    /// Job type names, shared by every job of a type.
    job_types: std::collections::HashSet<Arc<str>, NameHasher>,
    /// The next enqueue sequence number.
    pub(crate) next_seq: u64,
}

impl JobIndex {
    pub(crate) fn get(&self, id: JobId) -> Option<&Meta> {
        self.jobs.get(&id)
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
        let t: Arc<str> = Arc::from(job_type);
        self.job_types.insert(t.clone());
        t
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
    pub(crate) fn insert(&mut self, id: JobId, mut meta: Meta) {
        meta.queue = match meta.stage {
            Stage::Tombstone { .. } => match self.queues.get_key_value(&*meta.queue) {
                Some((k, _)) => k.clone(),
                None => meta.queue,
            },
            _ => self.intern(&meta.queue),
        };
        meta.job_type = self.intern_job_type(&meta.job_type);
        self.next_seq = self.next_seq.max(meta.seq + 1);
        self.place(id, &meta);
        if let Some(old) = self.jobs.insert(id, meta) {
            self.unplace(id, &old);
        }
    }

    /// Removes a job entirely.
    pub(crate) fn remove(&mut self, id: JobId) -> Option<Meta> {
        let meta = self.jobs.remove(&id)?;
        self.unplace(id, &meta);
        Some(meta)
    }

    /// Changes a job with `f`, keeping every ordered set in step. Returns the updated meta.
    pub(crate) fn update(&mut self, id: JobId, f: impl FnOnce(&mut Meta)) -> Option<&Meta> {
        let mut meta = self.jobs.remove(&id)?;
        self.unplace(id, &meta);
        f(&mut meta);
        self.place(id, &meta);
        self.jobs.insert(id, meta);
        self.jobs.get(&id)
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
        if self.jobs.capacity() > 1024 && self.jobs.capacity() > self.jobs.len() * 4 {
            self.jobs.shrink_to_fit();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Every job and its meta, in no order (tests compare memory with disk).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&JobId, &Meta)> {
        self.jobs.iter()
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
