//! Opening the data directory: format check, then the in-memory index rebuilt from the `meta`,
//! `queues`, `dedup` and `dedup_log` keyspaces. Payloads (`jobs`, `bodies`) are not read.
//!
//! fjall replays its journal on open, so every batch that was made durable before a crash is
//! there; a batch that was not is absent as a whole (write batches are atomic).

use super::codec::{self, DedupAt, DedupRecord, FORMAT_VERSION, Meta, QueueRecord};
use super::dedup_index::{DedupEntry, DedupIndex};
use super::group_commit::Keyspaces;
use super::job_index::{JobIndex, SharedKeyspaces};
use super::{RecoveryReport, State};
use crate::domain::{UnixMs, reached};
use crate::storage::StorageError;
use fjall::{KeyspaceCreateOptions, PersistMode};
use std::path::Path;
use std::sync::Arc;

fn io(e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(e.to_string())
}

/// The key of the sentinel entry in every keyspace. No record key can equal it: job ids are 16
/// bytes, enqueue numbers 8, dedup keys start with a non-empty queue name, queue keys are non-empty names without
/// control characters.
pub(super) const SENTINEL: &[u8] = &[0];

/// Memory and disk bounds of the engine. fjall's defaults (64 MiB memtables per keyspace, 512
/// MiB of journal) let a fill-and-drain cycle leave hundreds of MiB resident and on disk; a
/// queue's working set is small and short-lived, so smaller memtables (also cheaper to search
/// on every insert) and a bounded journal fit it better.
const MAX_JOURNAL: u64 = 192 * 1024 * 1024;
const BODIES_MEMTABLE: u64 = 32 * 1024 * 1024;
const INDEX_MEMTABLE: u64 = 16 * 1024 * 1024;
/// fjall's block cache. Its default, 32 MiB, cannot hold the index and filter blocks of a large
/// backlog (10 million jobs: about 2 GB of tables): every point read of a job's body or meta then
/// loads and checksums whole index and filter blocks from the page cache again, and a Reserve at
/// 10 million stored jobs ran at a tenth of its rate on an empty server. The cache fills only
/// with blocks that are read, so a small store does not pay for it.
const BLOCK_CACHE: u64 = 256 * 1024 * 1024;
/// fjall's background workers, which flush memtables and compact tables. fjall starts one per
/// CPU, at most 4; we start 4 whatever the CPU count, because fewer go wrong in fjall 3.1:
/// - one worker (a machine or container with one CPU) is the only reader of fjall's message
///   channel and, while rotating a memtable, waits to send into that same channel; under
///   sustained writes the channel can be full at that moment and every write stops for good
///   (the deadlock described in fjall's pull request 323);
/// - of two workers (two CPUs), worker 0 leaves compactions to worker 1: it puts each
///   compaction request it takes back into the channel and takes it again, spinning for as
///   long as worker 1 compacts. With 2 workers, fjall's threads spent 6.6 µs of CPU per job
///   under batches of 100 at 32 connections on 2 CPUs, with 4 workers 5.1, with the one
///   (unsafe) worker 4.7: the difference is the spinning. See docs/storage-engine.md.
const FJALL_WORKERS: usize = 4;

/// A fjall database builder with the settings every database of this store shares: the
/// journal is persisted by the group commit, bounded to [`MAX_JOURNAL`], and
/// [`FJALL_WORKERS`] background workers.
fn builder(path: &Path) -> fjall::DatabaseBuilder<fjall::Database> {
    fjall::Database::builder(path)
        .manual_journal_persist(true)
        .max_journaling_size(MAX_JOURNAL)
        .worker_threads(FJALL_WORKERS)
}

/// How many flushed tables level 0 of a keyspace collects before fjall merges them into level
/// 1 (fjall's default: 4). Idempotency keys, and job ids made before they were ordered
/// ([`crate::domain::JobId::ordered`]), are random, so a level-0 table of `dedup`, or of `meta`
/// in an older directory, spans the whole key range and each merge rewrites all of level 1; at
/// 8 the merges come half as often. fjall sizes
/// level 1 as this many tables of 64 MiB (512 MiB here), so level 1 is compressed too
/// ([`keyspace_options`]), or a burst of writes would leave up to twice as much uncompressed on
/// disk. fjall slows writes from 20 level-0 runs on and stops them at 30; flushes that land
/// while a merge runs pile up above 8, and a merge now moves about twice the bytes. The peak
/// count was not measured; the 10-million-job fills and 40 s floods of batches ran without a
/// visible stall. See "Level 0's threshold" in docs/benchmarks.md.
const L0_THRESHOLD: u8 = 8;

/// The options a keyspace of this store is created with, the live store's and a backup's
/// alike: its memtable bound, the level-0 threshold above, and LZ4 for data blocks from level
/// 1 on (fjall's default starts at level 2), from level 0 on for `bodies`, `dedup_log` and
/// `meta`: their new keys (enqueue numbers, `codec::BodyKey` and `codec::DedupAt`, and job ids,
/// which sort in creation order: `crate::domain::JobId::ordered`) arrive in ascending order, so
/// fjall moves their tables down without rewriting them, and a table left uncompressed at its
/// flush would stay so (10 s of batches of 100 left 2.1× the disk; with `meta` compressed only
/// from level 1, a data directory of 10 million jobs took 107-116 bytes per job, with LZ4 from
/// level 0 58-60). `jobs` holds only format-1 bodies, which are deleted
/// and never added: it gets an index keyspace's memtable. fjall applies these options only
/// when it creates the keyspace and keeps them with it: a keyspace created by an earlier sepp
/// keeps the options it was created with.
fn keyspace_options(name: &str) -> KeyspaceCreateOptions {
    use fjall::CompressionType as C;
    let (memtable, compression) = if name == "bodies" {
        (
            BODIES_MEMTABLE,
            fjall::config::CompressionPolicy::all(C::Lz4),
        )
    } else if name == "dedup_log" || name == "meta" {
        (
            INDEX_MEMTABLE,
            fjall::config::CompressionPolicy::all(C::Lz4),
        )
    } else {
        (
            INDEX_MEMTABLE,
            fjall::config::CompressionPolicy::new([C::None, C::Lz4]),
        )
    };
    KeyspaceCreateOptions::default()
        .max_memtable_size(memtable)
        .compaction_strategy(Arc::new(
            fjall::compaction::Leveled::default().with_l0_threshold(L0_THRESHOLD),
        ))
        .data_block_compression_policy(compression)
}

pub(super) fn open(
    path: &Path,
    now: UnixMs,
) -> Result<(SharedKeyspaces, State, RecoveryReport), StorageError> {
    let keyspaces = open_db(path)?;
    let shared = Arc::new(std::sync::RwLock::new(Some(keyspaces.clone())));
    let (state, report) = load_state(&keyspaces, Some(now), Some(&shared))?;
    Ok((shared, state, report))
}

/// Opens fjall at `path` (replaying its journal), checks the format version and makes sure every
/// keyspace has its sentinel. Writes only on a new directory, or to mark an older format's
/// directory with this build's version.
pub(super) fn open_db(path: &Path) -> Result<Keyspaces, StorageError> {
    let db = builder(path)
        .cache_size(BLOCK_CACHE)
        .open()
        .map_err(|e| match e {
            fjall::Error::Locked => StorageError::Io(format!(
                "cannot open {}: another process (another sepp?) holds its lock; stop it or \
                 choose another server.db_path",
                path.display()
            )),
            e => StorageError::Io(format!("cannot open {}: {e}", path.display())),
        })?;
    let ks = |name: &str| db.keyspace(name, || keyspace_options(name)).map_err(io);
    let info = ks("info")?;
    let keyspaces = Keyspaces {
        jobs: ks("jobs")?,
        bodies: ks("bodies")?,
        meta: ks("meta")?,
        dedup: ks("dedup")?,
        dedup_log: ks("dedup_log")?,
        queues: ks("queues")?,
        db: db.clone(),
    };

    match info.get("format_version").map_err(io)? {
        Some(v) => {
            let found = <[u8; 4]>::try_from(&*v)
                .map(u32::from_le_bytes)
                .map_err(|_| StorageError::Corrupt {
                    what: "format version",
                    detail: format!("{} bytes", v.len()),
                })?;
            if found > FORMAT_VERSION {
                return Err(StorageError::FormatVersion {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            if found < FORMAT_VERSION {
                // Every earlier format is read as it is (see `codec::FORMAT_VERSION`); from
                // now on this build writes records an older build would misread, so the
                // directory is marked before any of them.
                info.insert("format_version", FORMAT_VERSION.to_le_bytes())
                    .map_err(io)?;
                db.persist(PersistMode::SyncAll).map_err(io)?;
                tracing::info!(
                    from = found,
                    to = FORMAT_VERSION,
                    "storage format upgraded; older builds of sepp cannot open this directory"
                );
            }
        }
        None => {
            info.insert("format_version", FORMAT_VERSION.to_le_bytes())
                .map_err(io)?;
            db.persist(PersistMode::SyncAll).map_err(io)?;
        }
    }

    // fjall deletes an old journal only once every keyspace has flushed past it, and a
    // keyspace that has never been flushed at all (one nobody writes to, such as `dedup` on a
    // server whose producers send no keys) blocks that forever: the journal would grow without
    // bound. So each keyspace gets a sentinel entry flushed to a table once, at creation.
    for keyspace in [
        &info,
        &keyspaces.jobs,
        &keyspaces.bodies,
        &keyspaces.meta,
        &keyspaces.dedup,
        &keyspaces.dedup_log,
        &keyspaces.queues,
    ] {
        if !keyspace.contains_key(SENTINEL).map_err(io)? {
            keyspace.insert(SENTINEL, []).map_err(io)?;
            db.persist(PersistMode::SyncAll).map_err(io)?;
            keyspace.rotate_memtable_and_wait().map_err(io)?;
        }
    }

    Ok(keyspaces)
}

/// Rebuilds the in-memory index from what fjall holds. With `purge_expired_by` (at start),
/// dedup records that expired by then are deleted from disk on the way; without it (an
/// in-process rebuild after a failed write, when writing may be impossible) they are loaded and
/// the sweeper purges them. With `pager` (the store's handles), ready and scheduled jobs are
/// kept as keys only and their metas read back from there when needed; without it, every meta
/// stays in memory.
pub(super) fn load_state(
    keyspaces: &Keyspaces,
    purge_expired_by: Option<UnixMs>,
    pager: Option<&SharedKeyspaces>,
) -> Result<(State, RecoveryReport), StorageError> {
    let db = &keyspaces.db;
    let mut jobs = pager.map_or_else(JobIndex::default, |p| JobIndex::paged(p.clone()));
    for guard in keyspaces.meta.iter() {
        let (k, v) = guard.into_inner().map_err(io)?;
        if &*k == SENTINEL {
            continue;
        }
        let id = codec::decode_id(&k)?;
        jobs.recover(id, Meta::decode(&v)?);
    }

    for guard in keyspaces.queues.iter() {
        let (k, v) = guard.into_inner().map_err(io)?;
        if &*k == SENTINEL {
            continue;
        }
        let name: Arc<str> = String::from_utf8_lossy(&k).into_owned().into();
        let rec = QueueRecord::decode(&v)?;
        let name = jobs.intern(&name);
        jobs.queue_mut(&name).paused = rec.paused;
    }

    let mut dedup = DedupIndex::default();
    let mut report = RecoveryReport::default();
    // Records to delete on the way (at start only): expired ones, and a record that a later
    // one of the same key replaced (an upgraded directory's format-2 record is deleted in the
    // batch that writes its replacement, so this is only a safeguard).
    let mut stale: Vec<(DedupAt, Vec<u8>)> = Vec::new();
    let mut expired = 0;
    let mut load = |at: DedupAt, key: &[u8], rec: DedupRecord| {
        // A later record of the key replaces an earlier one, whether or not it is expired.
        if let Some(old) = dedup.get(key).copied() {
            dedup.remove(key);
            stale.push((old.at, key.to_vec()));
        }
        if purge_expired_by.is_some_and(|now| reached(rec.expires_at, now)) {
            expired += 1;
            stale.push((at, key.to_vec()));
            return;
        }
        dedup.insert(
            key,
            DedupEntry {
                job_id: rec.job_id,
                created_at: rec.created_at,
                expires_at: rec.expires_at,
                batch: 0,
                fingerprint: rec.fingerprint,
                at,
            },
        );
    };
    // Format 2's records first, then format 3's in the order they were written: a later
    // record of a key replaces an earlier one.
    for guard in keyspaces.dedup.iter() {
        let (k, v) = guard.into_inner().map_err(io)?;
        if &*k == SENTINEL {
            continue;
        }
        load(DedupAt::Keyed, &k, DedupRecord::decode(&v)?);
    }
    for guard in keyspaces.dedup_log.iter() {
        let (k, v) = guard.into_inner().map_err(io)?;
        if &*k == SENTINEL {
            continue;
        }
        let n = codec::decode_seq(&k)?;
        // A record can outlive its job, and its number must never be handed out again while
        // it is stored (a new record under it would overwrite it). Numbers count enqueues
        // from 0; one near 2^64 could only be damage, and counting on from it would wrap.
        if n >= 1 << 62 {
            return Err(StorageError::Corrupt {
                what: "dedup log key",
                detail: format!("enqueue number {n} is out of range"),
            });
        }
        jobs.next_seq = jobs.next_seq.max(n + 1);
        let (key, rec) = DedupRecord::decode_logged(&v)?;
        load(DedupAt::Log(n), key, rec);
    }
    if purge_expired_by.is_some() && !stale.is_empty() {
        report.dedup_expired = expired;
        let mut b = db.batch();
        for (at, key) in stale {
            match at {
                DedupAt::Log(n) => b.remove(&keyspaces.dedup_log, n.to_be_bytes()),
                DedupAt::Keyed => b.remove(&keyspaces.dedup, key),
            }
        }
        b.commit().map_err(io)?;
        db.persist(PersistMode::SyncAll).map_err(io)?;
    }
    report.jobs = jobs.len();
    report.dedup_records = dedup.len();
    Ok((State { jobs, dedup }, report))
}

/// The keyspaces a data directory holds, in the order a backup copies them.
const KEYSPACES: [&str; 7] = [
    "info",
    "jobs",
    "bodies",
    "meta",
    "dedup",
    "dedup_log",
    "queues",
];

/// Copies what `db` holds as of one snapshot into a new fjall database at `dir`, keyspace by
/// keyspace, and makes it durable. The snapshot is one sequence number: every group-commit
/// batch (the writes of one or more whole transitions, over every keyspace they touch) is
/// wholly in it or wholly out.
pub(super) fn backup(
    db: &fjall::Database,
    dir: &Path,
) -> Result<crate::storage::BackupReport, StorageError> {
    use fjall::Readable as _;
    let snapshot = db.snapshot();
    let out = builder(dir)
        .open()
        .map_err(|e| StorageError::Io(format!("backup: cannot create {}: {e}", dir.display())))?;
    let mut report = crate::storage::BackupReport::default();
    for name in KEYSPACES {
        let from = db.keyspace(name, || keyspace_options(name)).map_err(io)?;
        let to = out.keyspace(name, || keyspace_options(name)).map_err(io)?;
        let mut batch = out.batch();
        let mut in_batch = 0u64;
        for guard in snapshot.iter(&from) {
            let (k, v) = guard.into_inner().map_err(io)?;
            report.records += 1;
            report.bytes += (k.len() + v.len()) as u64;
            in_batch += (k.len() + v.len()) as u64;
            batch.insert(&to, k, v);
            if in_batch >= 8 * 1024 * 1024 {
                batch.commit().map_err(io)?;
                batch = out.batch();
                in_batch = 0;
            }
        }
        batch.commit().map_err(io)?;
        to.rotate_memtable_and_wait().map_err(io)?;
    }
    out.persist(PersistMode::SyncAll).map_err(io)?;
    drop(out);
    super::sync_dirs(dir)
        .map_err(|e| StorageError::Io(format!("backup: cannot sync {}: {e}", dir.display())))?;
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)
            .and_then(|f| f.sync_all())
            .map_err(|e| {
                StorageError::Io(format!("backup: cannot sync {}: {e}", parent.display()))
            })?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The level-0 threshold fjall keeps for `keyspace`, and whether the data blocks of level
    /// 0 and of level 1 are compressed.
    fn settings(keyspace: &fjall::Keyspace) -> (u8, bool, bool) {
        let config = keyspace.config.compaction_strategy.get_config();
        let (_, threshold) = config
            .iter()
            .find(|(k, _)| &**k == b"leveled_l0_threshold")
            .unwrap_or_else(|| panic!("no level-0 threshold in {config:?}"));
        let policy = &keyspace.config.data_block_compression_policy;
        // The last entry holds for every deeper level (lsm-tree's `CompressionPolicy::get`).
        let compressed = |level| {
            !matches!(
                policy.get(level).or(policy.last()),
                Some(fjall::CompressionType::None) | None
            )
        };
        (threshold[0], compressed(0), compressed(1))
    }

    /// What every keyspace of this store is created with: `bodies`, `dedup_log` and `meta`,
    /// written in key order and moved rather than merged, compressed from level 0, the others
    /// from level 1.
    fn assert_settings(ks: &Keyspaces, path: &Path) {
        for k in [&ks.bodies, &ks.dedup_log, &ks.meta] {
            assert_eq!(settings(k), (L0_THRESHOLD, true, true), "{path:?}");
        }
        for k in [&ks.jobs, &ks.dedup, &ks.queues] {
            assert_eq!(settings(k), (L0_THRESHOLD, false, true), "{path:?}");
        }
    }

    #[test]
    fn a_new_store_and_its_backup_get_the_compaction_settings_and_keep_them() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live");
        let ks = open_db(&live).unwrap();
        assert_settings(&ks, &live);
        let copy = dir.path().join("backup");
        backup(&ks.db, &copy).unwrap();
        drop(ks);
        for path in [&live, &copy] {
            let ks = open_db(path).unwrap();
            assert_settings(&ks, path);
        }
    }

    /// Also an alarm for a fjall upgrade: it pins fjall's own defaults (4 tables, level 1
    /// uncompressed), which the docs compare against.
    #[test]
    fn a_keyspace_created_with_fjalls_defaults_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let db = builder(dir.path()).open().unwrap();
        for name in KEYSPACES {
            db.keyspace(name, KeyspaceCreateOptions::default).unwrap();
        }
        db.persist(PersistMode::SyncAll).unwrap();
        drop(db);
        let ks = open_db(dir.path()).unwrap();
        assert_eq!(settings(&ks.jobs), (4, false, false));
    }
}
