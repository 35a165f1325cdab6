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
use indexmap::IndexMap;
use indexmap::map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
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

/// How many maps the records are spread over ([`DedupIndex`]).
const SHARDS: usize = 64;

/// One shard of the records: an [`IndexMap`], whose records sit in one vector, each with its
/// hash, while its hash table holds only their positions. Growing the table rehashes positions
/// from the stored hashes, where a `HashMap` re-ran SipHash over every key (one cache miss
/// each, through the key's pointer) and moved every 80-byte record. A removal moves the last
/// record into the hole (`swap_remove`); nothing here needs an order.
type Shard = IndexMap<Arc<[u8]>, DedupEntry>;

/// Keys and their expiry order. The key bytes are shared between the maps and the expiry set.
///
/// The records are spread over [`SHARDS`] maps by a hash of the key, so that a map grows (and
/// copies its records, under the store's lock) a sixty-fourth of the records at a time: with
/// one map of millions of records, each doubling held every transition for hundreds of
/// milliseconds. Within a shard the keys are hashed with SipHash (keys are chosen by
/// clients); the shard is chosen by foldhash, randomly seeded: keys picked to crowd one shard
/// would only bring back one map's growth.
#[derive(Debug)]
pub(crate) struct DedupIndex {
    shards: Box<[Shard]>,
    pick: foldhash::fast::RandomState,
    len: usize,
    by_expiry: BTreeSet<ExpiryKey>,
    per_queue: HashMap<Box<str>, u64, super::job_index::NameHasher>,
}

impl Default for DedupIndex {
    fn default() -> Self {
        DedupIndex {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            pick: foldhash::fast::RandomState::default(),
            len: 0,
            by_expiry: BTreeSet::new(),
            per_queue: HashMap::default(),
        }
    }
}

impl DedupIndex {
    fn shard(&self, key: &[u8]) -> usize {
        (self.pick.hash_one(key) as usize) % SHARDS
    }

    /// The record of `key`, live or expired but not purged yet (whether it still
    /// deduplicates is the queue layer's decision).
    pub(crate) fn get(&self, key: &[u8]) -> Option<&DedupEntry> {
        self.shards[self.shard(key)].get(key)
    }

    /// Writes (or replaces an expired) record.
    pub(crate) fn insert(&mut self, key: &[u8], entry: DedupEntry) {
        // One lookup in the map; the queue's count changes only for a new key (a replaced
        // record is of the same queue), and its name is copied only for a queue's first record.
        let shard = self.shard(key);
        let key = match self.shards[shard].entry(Arc::from(key)) {
            Entry::Occupied(mut o) => {
                let old = o.insert(entry);
                let key = o.key().clone();
                self.by_expiry.remove(&expiry_key(&old, key.clone()));
                key
            }
            Entry::Vacant(v) => {
                let key = v.key().clone();
                v.insert(entry);
                self.len += 1;
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
        let shard = self.shard(key);
        let Some((k, e)) = self.shards[shard].swap_remove_entry(key) else {
            return false;
        };
        self.len -= 1;
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
            let Some(at) = self.get(&key).map(|e| e.at) else {
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
        for shard in self.shards.iter_mut() {
            if shard.capacity() > 1024 && shard.capacity() > shard.len() * 4 {
                shard.shrink_to_fit();
            }
        }
    }

    /// The earliest expiry, if any record exists.
    pub(crate) fn next_expiry(&self) -> Option<UnixMs> {
        self.by_expiry.first().map(|(e, _, _)| *e)
    }

    /// The record that expires next, if any.
    pub(crate) fn next_expiring(&self) -> Option<&DedupEntry> {
        self.by_expiry.first().and_then(|(_, _, k)| self.get(k))
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
        self.len
    }

    /// Every record, in no order (tests compare memory with disk).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<[u8]>, &DedupEntry)> {
        self.shards.iter().flat_map(|s| s.iter())
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
    fn records_spread_over_the_shards_are_counted_found_and_removed_once() {
        let mut idx = DedupIndex::default();
        let keys: Vec<Vec<u8>> = (0..5_000)
            .map(|i| record_key(if i % 2 == 0 { "a" } else { "b" }, &format!("k{i}")))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            idx.insert(k, entry(1_000 + i as i64));
        }
        assert!(
            idx.shards.iter().all(|s| !s.is_empty()),
            "5,000 keys reach every shard"
        );
        assert_eq!(idx.len(), 5_000);
        assert_eq!(idx.iter().count(), 5_000);
        for k in keys.iter().step_by(2) {
            assert!(idx.remove(k));
            assert!(!idx.remove(k), "a removed record is gone");
        }
        assert_eq!(idx.len(), 2_500);
        assert_eq!(idx.iter().count(), 2_500);
        assert_eq!(idx.count_for_queue("a"), 0);
        assert_eq!(idx.count_for_queue("b"), 2_500);
        // A removal moves another record into its place: every survivor is still found.
        for (i, k) in keys.iter().enumerate().skip(1).step_by(2) {
            assert_eq!(idx.get(k).map(|e| e.expires_at), Some(1_000 + i as i64));
        }
        idx.shrink_if_sparse();
        assert_eq!(idx.purge_expired(i64::MAX, usize::MAX).len(), 2_500);
        assert_eq!(idx.len(), 0);
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
