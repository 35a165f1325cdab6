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
use tokio::sync::watch;

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
        loop {
            let (ops, id) = {
                let mut f = self.filling.lock().unwrap_or_else(|e| e.into_inner());
                while f.ops.is_empty() && !f.closing {
                    f = self.work.wait(f).unwrap_or_else(|e| e.into_inner());
                }
                if f.ops.is_empty() {
                    return;
                }
                let ops = std::mem::take(&mut f.ops);
                let id = f.id;
                f.id += 1;
                (ops, id)
            };
            let mut batch = ks.db.batch().durability(Some(mode));
            for op in ops {
                let keyspace = ks.get(op.ks);
                match op.value {
                    Some(v) => batch.insert(keyspace, op.key, v),
                    None => batch.remove(keyspace, op.key),
                }
            }
            match batch.commit() {
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
