//! The dedup index of the embedded store: idempotency key → original job, held in memory so a
//! hit is answered without touching the disk, mirrored on disk so it survives restarts (in
//! `dedup_log`, or in `dedup` for records of format 2 and earlier; see [`DedupAt`]). Rebuilt from
//! those keyspaces at start-up.
//!
//! Records are keyed by [`super::codec::record_key`] (queue, NUL, key). Each remembers
//! the group-commit batch that wrote it, so a hit on a record that is not yet durable waits for
//! that batch before answering, and where it is on disk ([`DedupAt`]), so that its delete
//! needs no lookup.

use super::codec::{DedupAt, record_queue};
use crate::domain::{Fingerprint, JobId, UnixMs, reached};
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// One live (or expired, not yet swept) record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    pub(crate) job_id: JobId,
    pub(crate) created_at: UnixMs,
    pub(crate) expires_at: UnixMs,
    /// The group-commit batch that wrote the record (0: recovered from disk, durable).
    pub(crate) batch: u64,
    /// What defined the job (`key_conflict = "reject"`); 8 bytes, in what would otherwise be
    /// padding (`JobId` aligns the entry to 16).
    pub(crate) fingerprint: Option<Fingerprint>,
    /// Where the record is on disk.
    pub(crate) at: DedupAt,
}

/// A record's place in the expiry order: its expiry, then the low 64 bits of its job's id,
/// then its key. The records of a batch share their expiry, and their keys often share a long
/// prefix; the job id (random, one per record) orders them without comparing the keys' bytes
/// (the key still breaks a tie, so that two records never share a place).
type ExpiryKey = (UnixMs, u64, Arc<[u8]>);

fn expiry_key(e: &DedupEntry, key: Arc<[u8]>) -> ExpiryKey {
    (e.expires_at, e.job_id.0 as u64, key)
}

/// Keys and their expiry order. The key bytes are shared between the map and the expiry set.
#[derive(Debug, Default)]
pub(crate) struct DedupIndex {
    map: HashMap<Arc<[u8]>, DedupEntry>,
    by_expiry: BTreeSet<ExpiryKey>,
    per_queue: HashMap<Box<str>, u64, super::job_index::NameHasher>,
}

impl DedupIndex {
    /// The record of `key`, live or expired but not purged yet (whether it still
    /// deduplicates is the queue layer's decision).
    pub(crate) fn get(&self, key: &[u8]) -> Option<&DedupEntry> {
        self.map.get(key)
    }

    /// Writes (or replaces an expired) record.
    pub(crate) fn insert(&mut self, key: &[u8], entry: DedupEntry) {
        // One lookup in the map; the queue's count changes only for a new key (a replaced
        // record is of the same queue), and its name is copied only for a queue's first record.
        let key = match self.map.entry(Arc::from(key)) {
            Entry::Occupied(mut o) => {
                let old = o.insert(entry);
                let key = o.key().clone();
                self.by_expiry.remove(&expiry_key(&old, key.clone()));
                key
            }
            Entry::Vacant(v) => {
                let key = v.key().clone();
                v.insert(entry);
                if let Some(q) = record_queue(&key) {
                    match self.per_queue.get_mut(q) {
                        Some(n) => *n += 1,
                        None => {
                            self.per_queue.insert(q.into(), 1);
                        }
                    }
                }
                key
            }
        };
        self.by_expiry.insert(expiry_key(&entry, key));
    }

    /// Removes a record; returns whether there was one.
    pub(crate) fn remove(&mut self, key: &[u8]) -> bool {
        let Some((k, e)) = self.map.remove_entry(key) else {
            return false;
        };
        self.by_expiry.remove(&expiry_key(&e, k.clone()));
        if let Some(q) = record_queue(&k)
            && let Some(n) = self.per_queue.get_mut(q)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_queue.remove(q);
            }
        }
        true
    }

    /// Removes up to `budget` records expired at `now`; returns their keys and places (to
    /// delete on disk).
    pub(crate) fn purge_expired(
        &mut self,
        now: UnixMs,
        budget: usize,
    ) -> Vec<(Arc<[u8]>, DedupAt)> {
        let mut purged = Vec::new();
        while purged.len() < budget {
            let Some((exp, _, key)) = self.by_expiry.first().cloned() else {
                break;
            };
            if !reached(exp, now) {
                break;
            }
            // Every key of the expiry set is in the map (insert and remove keep them paired).
            let Some(at) = self.map.get(&key).map(|e| e.at) else {
                self.by_expiry.pop_first();
                continue;
            };
            self.remove(&key);
            purged.push((key, at));
        }
        purged
    }

    /// Shrinks the map once most of it has been purged, so that memory comes back. Called when
    /// a sweep has caught up, not per pass: rehashing a large table holds the store's lock.
    pub(crate) fn shrink_if_sparse(&mut self) {
        if self.map.capacity() > 1024 && self.map.capacity() > self.map.len() * 4 {
            self.map.shrink_to_fit();
        }
    }

    /// The earliest expiry, if any record exists.
    pub(crate) fn next_expiry(&self) -> Option<UnixMs> {
        self.by_expiry.first().map(|(e, _, _)| *e)
    }

    /// The record that expires next, if any.
    pub(crate) fn next_expiring(&self) -> Option<&DedupEntry> {
        self.by_expiry.first().and_then(|(_, _, k)| self.map.get(k))
    }

    /// Queues with records, and how many each has.
    pub(crate) fn queue_counts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.per_queue.iter().map(|(q, n)| (&**q, *n))
    }

    /// Records (live or awaiting the sweep) of one queue.
    pub(crate) fn count_for_queue(&self, queue: &str) -> u64 {
        self.per_queue.get(queue).copied().unwrap_or(0)
    }

    /// Records of all queues.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Every record, in no order (tests compare memory with disk).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<[u8]>, &DedupEntry)> {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::codec::record_key;

    fn entry(expires_at: UnixMs) -> DedupEntry {
        DedupEntry {
            job_id: JobId(1),
            created_at: 0,
            expires_at,
            batch: 0,
            fingerprint: None,
            at: DedupAt::Log(1),
        }
    }

    /// 48 bytes without `at`: it costs 16 per record (about 2 % of a keyed job's 830 bytes of
    /// RSS in "Memory and the dedup window", docs/benchmarks.md).
    #[test]
    fn the_entry_is_64_bytes() {
        assert_eq!(std::mem::size_of::<DedupEntry>(), 64);
    }

    #[test]
    fn records_are_purged_from_their_expiry_on() {
        let mut idx = DedupIndex::default();
        let k = record_key("q", "k");
        idx.insert(&k, entry(100));
        assert!(idx.get(&k).is_some());
        assert_eq!(idx.purge_expired(99, 10).len(), 0, "live at 99");
        assert_eq!(idx.count_for_queue("q"), 1);
        assert_eq!(idx.purge_expired(100, 10).len(), 1);
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.count_for_queue("q"), 0);
        assert_eq!(idx.next_expiry(), None);
    }

    #[test]
    fn a_replaced_record_keeps_one_entry_and_its_new_expiry() {
        let mut idx = DedupIndex::default();
        let k = record_key("q", "k");
        idx.insert(&k, entry(100));
        idx.insert(&record_key("q", "other"), entry(300));
        idx.insert(&k, entry(200));
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.count_for_queue("q"), 2);
        assert_eq!(idx.get(&k).map(|e| e.expires_at), Some(200));
        assert_eq!(idx.next_expiry(), Some(200), "the old expiry is gone");
        assert_eq!(idx.purge_expired(199, 10).len(), 0);
        assert_eq!(idx.purge_expired(200, 10).len(), 1);
        assert_eq!(idx.count_for_queue("q"), 1);
        assert!(idx.get(&k).is_none());
    }

    #[test]
    fn records_of_one_expiry_are_kept_apart_by_job_and_key() {
        // The expiry order breaks ties by job id, then by key: every record keeps its own
        // place, a removed or replaced one leaves none behind.
        let mut idx = DedupIndex::default();
        let at = |id: u128| DedupEntry {
            job_id: JobId(id),
            ..entry(50)
        };
        for i in 0..20u128 {
            // Two records per job id: the key breaks the tie.
            idx.insert(&record_key("q", &format!("k{i}")), at(i / 2));
        }
        assert!(idx.remove(&record_key("q", "k3")));
        idx.insert(&record_key("q", "k4"), at(99));
        assert_eq!(idx.len(), 19);
        assert_eq!(idx.purge_expired(49, 100).len(), 0);
        let mut purged = idx.purge_expired(50, 100);
        purged.sort();
        assert_eq!(purged.len(), 19);
        purged.dedup();
        assert_eq!(purged.len(), 19, "each record purged once");
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.next_expiry(), None);
        assert_eq!(idx.count_for_queue("q"), 0);
    }

    #[test]
    fn purge_respects_its_budget_and_expiry_order() {
        let mut idx = DedupIndex::default();
        for i in 0..10 {
            idx.insert(&record_key("q", &format!("k{i}")), entry(10 + i));
        }
        assert_eq!(idx.purge_expired(1_000, 3).len(), 3);
        assert_eq!(idx.next_expiry(), Some(13));
    }
}
