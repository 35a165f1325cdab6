//! The sweeper: one background task that expires leases, promotes due scheduled jobs, purges
//! expired dedup records and retained records past their retention.
//!
//! It sleeps until the earliest deadline the store reports, is woken early when an earlier one
//! appears, never sleeps longer than `sweep_interval_ms` (a safety net), and bounds each pass
//! to [`PASS_BUDGET`] items so that a mass expiry never holds the store for long: when a pass
//! hits its budget, the store waits for that pass's writes to be durable, and the sweeper goes
//! again after [`PASS_PAUSE`]. So a mass expiry proceeds at most one pass per group commit,
//! never fills the batches that client calls wait for, and spreads its deletes over time.

use super::clock::Clock;
use crate::storage::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Most items one pass handles before yielding.
pub const PASS_BUDGET: usize = 256;

/// The pause between passes while a backlog lasts: at most about 50,000 items a second.
pub const PASS_PAUSE: Duration = Duration::from_millis(5);

/// Runs until `shutdown` is cancelled. The caller owns the task handle and awaits it at
/// shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    interval_ms: u64,
    shutdown: CancellationToken,
) {
    loop {
        let now = clock.now();
        let sleep_ms = match store.maintain(now, PASS_BUDGET).await {
            Ok(r) => {
                if r.redelivered + r.dead_lettered + r.promoted + r.dedup_purged + r.records_purged
                    > 0
                {
                    tracing::debug!(
                        redelivered = r.redelivered,
                        dead_lettered = r.dead_lettered,
                        promoted = r.promoted,
                        dedup_purged = r.dedup_purged,
                        records_purged = r.records_purged,
                        "sweeper pass"
                    );
                }
                if r.more {
                    // Spread a mass expiry out: deleting a million records back to back
                    // floods the storage engine with tombstones and flushes, and every client
                    // call waits behind them.
                    tokio::select! {
                        _ = tokio::time::sleep(PASS_PAUSE) => continue,
                        // A stop must not wait for the backlog: what is left is swept after
                        // the restart (expired records already count as absent).
                        _ = shutdown.cancelled() => return,
                    }
                }
                r.next_deadline
                    .map_or(interval_ms, |d| (d - clock.now()).max(0) as u64)
                    .min(interval_ms)
            }
            // Refused writes (no space left, a failed write) are logged by the store once.
            Err(e @ crate::storage::StorageError::Unavailable(_)) => {
                tracing::debug!(error = %e, "sweeper pass refused");
                interval_ms
            }
            Err(e) => {
                tracing::error!(error = %e, "sweeper pass failed");
                interval_ms
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            _ = store.deadline_changed() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::PersistMode;
    use crate::domain::{DedupClaim, JobId, NewJob};
    use crate::queue::clock::SystemClock;
    use crate::storage::ReadySignals;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};
    use std::time::Instant;

    /// A stop during a mass expiry returns at once; the rest is swept after the restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_during_a_mass_expiry_does_not_wait_for_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            EmbeddedStore::open(
                EmbeddedOptions {
                    path: dir.path().join("data"),
                    persist_mode: PersistMode::Buffer,
                    dead_letter_retention_ms: 0,
                    min_free_bytes: 0,
                },
                Arc::new(ReadySignals::default()),
                SystemClock.now(),
            )
            .unwrap(),
        );
        // 40,000 records that expire at once: at most PASS_BUDGET per PASS_PAUSE, so well
        // over half a second of sweeping.
        let now = SystemClock.now();
        for chunk in 0..40 {
            let jobs = (0..1000)
                .map(|i| NewJob {
                    id: JobId::new_v4(),
                    queue: Arc::from("q"),
                    job_type: "t".into(),
                    payload: None,
                    priority: 0,
                    max_attempts: 1,
                    trace_context: None,
                    custom: Default::default(),
                    enqueued_at: now,
                    scheduled_at: None,
                    dedup: Some(DedupClaim {
                        key: format!("k{chunk}-{i}"),
                        expires_at: now + 50,
                    }),
                    max_queue_depth: None,
                    reply_bytes: 200,
                })
                .collect();
            store.enqueue(jobs, false, now).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;

        let shutdown = CancellationToken::new();
        let sweeper = tokio::spawn(run(
            store.clone() as Arc<dyn Store>,
            Arc::new(SystemClock),
            1000,
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let left = store.queue_stats("q").await.unwrap().dedup_records;
        assert!(left > 0, "the sweep should still be running");
        let stopped = Instant::now();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), sweeper)
            .await
            .expect("the sweeper stops within a second of the cancel")
            .unwrap();
        assert!(stopped.elapsed() < Duration::from_secs(1));
        let after = store.queue_stats("q").await.unwrap().dedup_records;
        assert!(
            after > 0,
            "it stopped with records left ({after}), not after the backlog"
        );
        store.close().await.unwrap();
    }
}
