//! The sweeper: one background task that expires leases, promotes due scheduled jobs, purges
//! expired dedup records and retained records past their retention.
//!
//! It sleeps until the earliest deadline the store reports, is woken early when an earlier one
//! appears, never sleeps longer than `sweep_interval_ms` (a safety net), and bounds each pass
//! to [`PASS_BUDGET`] items so that a mass expiry never holds the store for long: when a pass
//! hits its budget, the store waits for that pass's writes to be durable, and the sweeper goes
//! again after [`PASS_PAUSE`]. So a mass expiry proceeds at most one pass per group commit,
//! never fills the batches that client calls wait for, and spreads its deletes over time.

use super::model::now_ms;
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
pub async fn run(store: Arc<dyn Store>, interval_ms: u64, shutdown: CancellationToken) {
    loop {
        let now = now_ms();
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
                    tokio::time::sleep(PASS_PAUSE).await;
                    continue;
                }
                r.next_deadline
                    .map_or(interval_ms, |d| (d - now_ms()).max(0) as u64)
                    .min(interval_ms)
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
