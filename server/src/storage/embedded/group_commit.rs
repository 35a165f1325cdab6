//! Group commit: many concurrent transitions share one journal write and one fsync.
//!
//! Transitions append their writes to the batch being filled (while holding the store's state
//! lock, so batches follow state order) and get that batch's number. One flusher thread takes
//! the whole batch, writes it to fjall as one atomic write batch, makes it durable as the
//! `persist_mode` says, and publishes the batch number. While it flushes, the next batch fills;
//! so the more concurrent writers, the more writes each fsync carries.
//!
//! A transition replies only after [`GroupCommit::wait`] sees its batch durable. If a flush
//! fails, the store is poisoned: every waiter and every later write gets
//! [`StorageError::Unavailable`], because memory is now ahead of the disk and only a restart
//! (recovery from disk) makes them agree again.

use crate::config::PersistMode;
use crate::storage::StorageError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ks {
    Jobs,
    Meta,
    Dedup,
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
    pub(crate) meta: fjall::Keyspace,
    pub(crate) dedup: fjall::Keyspace,
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
        for ks in [&self.jobs, &self.meta, &self.dedup, &self.queues] {
            if let Err(e) = ks.rotate_memtable() {
                tracing::warn!(error = %e, "sealing an idle memtable failed");
            }
        }
        tracing::debug!(bytes, "sealed idle memtables");
    }

    fn get(&self, ks: Ks) -> &fjall::Keyspace {
        match ks {
            Ks::Jobs => &self.jobs,
            Ks::Meta => &self.meta,
            Ks::Dedup => &self.dedup,
            Ks::Queues => &self.queues,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Durable {
    batch: u64,
    failed: Option<String>,
}

#[derive(Debug)]
struct Filling {
    ops: Vec<WriteOp>,
    /// The number of the batch being filled; batch 0 is "already durable".
    id: u64,
    closing: bool,
    failed: Option<String>,
}

/// The batch being filled and the durability watermark.
pub(crate) struct GroupCommit {
    filling: Mutex<Filling>,
    /// Signalled when the filling batch gets its first op, or on close. The flusher waits on it.
    work: Condvar,
    /// The last durable batch; the flusher is the only sender.
    durable: watch::Sender<Durable>,
    durable_batch: AtomicU64,
    mode: PersistMode,
}

impl GroupCommit {
    pub(crate) fn new(mode: PersistMode) -> Self {
        GroupCommit {
            filling: Mutex::new(Filling {
                ops: Vec::new(),
                id: 1,
                closing: false,
                failed: None,
            }),
            work: Condvar::new(),
            durable: watch::Sender::new(Durable::default()),
            durable_batch: AtomicU64::new(0),
            mode,
        }
    }

    /// Appends `ops` to the filling batch and returns its number (0 when `ops` is empty).
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] once a flush has failed or the store is closing.
    pub(crate) fn append(&self, ops: Vec<WriteOp>) -> Result<u64, StorageError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &f.failed {
            return Err(StorageError::Unavailable(why.clone()));
        }
        if f.closing {
            return Err(StorageError::Unavailable(
                "the server is shutting down".into(),
            ));
        }
        let was_empty = f.ops.is_empty();
        if was_empty {
            f.ops = ops;
        } else {
            f.ops.extend(ops);
        }
        let id = f.id;
        drop(f);
        if was_empty {
            self.work.notify_one();
        }
        Ok(id)
    }

    /// Fails fast when the store is poisoned.
    pub(crate) fn check_writable(&self) -> Result<(), StorageError> {
        let f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
        match &f.failed {
            Some(why) => Err(StorageError::Unavailable(why.clone())),
            None => Ok(()),
        }
    }

    /// The newest durable batch.
    pub(crate) fn durable_batch(&self) -> u64 {
        self.durable_batch.load(Ordering::Acquire)
    }

    /// Waits until batch `id` is durable.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] if a flush failed before it got there.
    pub(crate) async fn wait(&self, id: u64) -> Result<(), StorageError> {
        if id == 0 || self.durable_batch() >= id {
            return Ok(());
        }
        let mut rx = self.durable.subscribe();
        let d = rx
            .wait_for(|d| d.batch >= id || d.failed.is_some())
            .await
            .map_err(|_| StorageError::Unavailable("the flusher stopped".into()))?;
        if d.batch >= id {
            return Ok(());
        }
        Err(StorageError::Unavailable(
            d.failed.clone().unwrap_or_default(),
        ))
    }

    /// The flusher loop; runs on its own thread until [`GroupCommit::close`].
    pub(crate) fn run_flusher(&self, ks: &Keyspaces) {
        let mode = match self.mode {
            PersistMode::SyncAll => fjall::PersistMode::SyncAll,
            PersistMode::SyncData => fjall::PersistMode::SyncData,
            PersistMode::Buffer => fjall::PersistMode::Buffer,
        };
        // Whether anything was written since the memtables were last sealed for idleness.
        let mut written = false;
        loop {
            let next = {
                let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if !f.ops.is_empty() {
                        let ops = std::mem::take(&mut f.ops);
                        let id = f.id;
                        f.id += 1;
                        break Some((ops, id));
                    }
                    if f.closing {
                        return;
                    }
                    if !written {
                        f = self.work.wait(f).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    let (g, waited) = self
                        .work
                        .wait_timeout(f, IDLE_SEAL_AFTER)
                        .unwrap_or_else(|e| e.into_inner());
                    f = g;
                    if waited.timed_out() && f.ops.is_empty() && !f.closing {
                        break None;
                    }
                }
            };
            let Some((ops, id)) = next else {
                written = false;
                ks.seal_idle_memtables();
                continue;
            };
            written = true;
            let mut batch = ks.db.batch().durability(Some(mode));
            for op in ops {
                let keyspace = ks.get(op.ks);
                match op.value {
                    Some(v) => batch.insert(keyspace, op.key, v),
                    None => batch.remove(keyspace, op.key),
                }
            }
            let started = std::time::Instant::now();
            let result = batch.commit();
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
                    self.durable_batch.store(id, Ordering::Release);
                    self.durable.send_modify(|d| d.batch = id);
                }
                Err(e) => {
                    let why = format!("write of batch {id} failed: {e}");
                    tracing::error!(error = %e, batch = id, "storage write failed; refusing further writes until restart");
                    self.filling
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .failed = Some(why.clone());
                    self.durable.send_modify(|d| d.failed = Some(why));
                }
            }
        }
    }

    /// Asks the flusher to write what is pending and stop.
    pub(crate) fn close(&self) {
        self.filling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closing = true;
        self.work.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// A store that goes quiet gets its memtables written out and their memory freed, instead
    /// of holding them until they reach their size bound.
    #[test]
    fn idle_flusher_seals_memtables_after_quiet_period() {
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
            meta: ks("meta"),
            dedup: ks("dedup"),
            queues: ks("queues"),
            db: db.clone(),
        };
        let commit = Arc::new(GroupCommit::new(PersistMode::Buffer));
        let flusher = {
            let (commit, keyspaces) = (commit.clone(), keyspaces.clone());
            std::thread::spawn(move || commit.run_flusher(&keyspaces))
        };
        // About 4 MiB in memtables: well over IDLE_SEAL_MIN_BYTES.
        let ops = (0u32..4096)
            .map(|i| WriteOp::put(Ks::Jobs, i.to_be_bytes().to_vec(), vec![7; 1024]))
            .collect();
        let batch = commit.append(ops).expect("append");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(commit.wait(batch)).expect("durable");
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
