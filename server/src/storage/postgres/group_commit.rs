//! Group commit of enqueues: concurrent enqueues on one server share one transaction.
//!
//! An enqueue joins the *filling* transaction (opening one on a pooled connection when there is
//! none, which wakes the committer), runs its statements inside its own savepoint, and waits
//! for that transaction's `COMMIT`. The committer takes the filling transaction (once the
//! enqueue that holds it is done with its statements), commits it and tells every enqueue of it
//! the result; meanwhile new enqueues fill the next one. So N concurrent enqueues cost one
//! `COMMIT` (one WAL flush) instead of N, and none replies before its `COMMIT`.

use super::{pg_err, pool_err};
use crate::storage::StorageError;
use deadpool_postgres::{Object, Pool};
use std::sync::Arc;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, watch};

type Outcome = Option<Result<(), String>>;

struct Filling {
    client: Object,
    done: watch::Sender<Outcome>,
}

struct Inner {
    pool: Pool,
    filling: Arc<Mutex<Option<Filling>>>,
    wake: Notify,
    /// Set by `close`: no transaction is opened after it.
    closed: std::sync::atomic::AtomicBool,
}

/// The group committer of one store.
pub(crate) struct GroupCommit {
    inner: Arc<Inner>,
    committer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// An enqueue's place in the filling transaction: while it is held, no one else runs
/// statements in it and it is not committed.
pub(crate) struct Slot {
    guard: OwnedMutexGuard<Option<Filling>>,
}

impl Slot {
    /// The connection of the filling transaction.
    pub(crate) fn client(&self) -> &Object {
        match &*self.guard {
            Some(f) => &f.client,
            None => unreachable!("a slot always holds a filling transaction"),
        }
    }

    /// The transaction is unusable (a statement could not be rolled back to its savepoint):
    /// every enqueue in it fails, and its connection is closed rather than pooled.
    pub(crate) fn poison(&mut self) {
        if let Some(f) = self.guard.take() {
            let _ = f.done.send(Some(Err(
                "the PostgreSQL transaction of this enqueue failed".to_string(),
            )));
            drop(Object::take(f.client));
        }
    }

    /// Leaves the transaction to the committer and waits for its `COMMIT`.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when the commit failed (or its outcome is unknown).
    pub(crate) async fn wait(self) -> Result<(), StorageError> {
        let mut rx = match &*self.guard {
            Some(f) => f.done.subscribe(),
            None => {
                return Err(StorageError::Unavailable(
                    "the PostgreSQL transaction of this enqueue failed".into(),
                ));
            }
        };
        drop(self.guard);
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StorageError::Unavailable("the group commit stopped".into()))?
            .clone();
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(StorageError::Unavailable(e)),
            None => Err(StorageError::Unavailable("the group commit stopped".into())),
        }
    }
}

async fn commit(f: Filling) {
    let outcome = match f.client.batch_execute("COMMIT").await {
        Ok(()) => Ok(()),
        Err(e) => {
            let msg = match pg_err(e) {
                StorageError::Unavailable(m) | StorageError::Io(m) => m,
                other => other.to_string(),
            };
            drop(Object::take(f.client));
            let _ = f.done.send(Some(Err(format!(
                "PostgreSQL COMMIT failed (the enqueue may or may not be stored): {msg}"
            ))));
            return;
        }
    };
    let _ = f.done.send(Some(outcome));
}

impl GroupCommit {
    /// Starts the committer (needs a Tokio runtime).
    pub(crate) fn new(pool: Pool) -> Self {
        let inner = Arc::new(Inner {
            pool,
            filling: Arc::new(Mutex::new(None)),
            wake: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let committer = {
            let inner = inner.clone();
            tokio::spawn(async move {
                loop {
                    inner.wake.notified().await;
                    let taken = inner.filling.lock().await.take();
                    if let Some(f) = taken {
                        commit(f).await;
                    }
                    if inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
                        // No transaction opens after `closed` (checked under the lock): this
                        // last take finds any that opened before it.
                        let taken = inner.filling.lock().await.take();
                        if let Some(f) = taken {
                            commit(f).await;
                        }
                        break;
                    }
                }
            })
        };
        GroupCommit {
            inner,
            committer: std::sync::Mutex::new(Some(committer)),
        }
    }

    /// Joins the filling transaction, opening one if there is none.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when no connection can be had or `BEGIN` fails.
    pub(crate) async fn join(&self) -> Result<Slot, StorageError> {
        let mut guard = self.inner.filling.clone().lock_owned().await;
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StorageError::Unavailable(
                "storage is closed: the server is shutting down".into(),
            ));
        }
        if guard.is_none() {
            let client = self.inner.pool.get().await.map_err(pool_err)?;
            if let Err(e) = client.batch_execute("BEGIN").await {
                drop(Object::take(client));
                return Err(pg_err(e));
            }
            let (done, _) = watch::channel(None);
            *guard = Some(Filling { client, done });
            self.inner.wake.notify_one();
        }
        Ok(Slot { guard })
    }

    /// Commits what is filling and stops the committer once it has.
    pub(crate) async fn close(&self) {
        {
            let _guard = self.inner.filling.lock().await;
            self.inner
                .closed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.wake.notify_one();
        let handle = self
            .committer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        if let Some(h) = self
            .committer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.abort();
        }
    }
}
