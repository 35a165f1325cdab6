//! Long-poll Reserve: look for ready jobs across the listed queues; if there are none, wait
//! until a job becomes ready on one of them, the wait runs out, or the server shuts down.
//!
//! A waiter registers on each queue's ready signal *before* it looks, so a job that becomes
//! ready between the look and the wait still wakes it: no polling interval, no lost wake-up.
//! A Reserve whose client goes away is dropped by the gRPC stack while it waits; the lease is
//! only taken inside one storage transition, so a cancelled wait leases nothing.

use super::clock::Clock;
use crate::domain::{Job, ReserveSpec};
use crate::storage::{ReadySignals, StorageError, Store};
use futures_util::future::select_all;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Leases jobs per `spec`, waiting up to `wait_ms` for the first one.
///
/// # Errors
/// [`StorageError`] from the store.
pub async fn reserve_with_wait(
    store: &dyn Store,
    clock: &dyn Clock,
    signals: &ReadySignals,
    spec: &ReserveSpec,
    wait_ms: u64,
    shutdown: &CancellationToken,
) -> Result<Vec<Job>, StorageError> {
    if wait_ms == 0 {
        return store.reserve(spec, clock.now()).await;
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let signals: Vec<_> = spec.queues.iter().map(|q| signals.subscribe(q)).collect();
    loop {
        let mut wakeups: Vec<_> = signals.iter().map(|n| Box::pin(n.notified())).collect();
        for w in &mut wakeups {
            w.as_mut().enable();
        }
        let jobs = store.reserve(spec, clock.now()).await?;
        if !jobs.is_empty() || shutdown.is_cancelled() || Instant::now() >= deadline {
            return Ok(jobs);
        }
        tokio::select! {
            _ = select_all(wakeups) => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
            _ = shutdown.cancelled() => return Ok(Vec::new()),
        }
    }
}
