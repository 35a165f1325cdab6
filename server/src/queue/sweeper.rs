//! The sweeper: one background task that expires leases, promotes due scheduled jobs, purges
//! expired dedup records and retained records past their retention.
//!
//! Each pass is [`Queue::sweep`]: one bounded [`crate::storage::Store::maintain`] transition with the queue's
//! rules for what an expired lease does and what stays of a dead letter past its retention. The
//! task sleeps until the earliest deadline the pass reports, is woken early when a transition
//! creates an earlier one ([`SweepWake`]), never sleeps longer than `sweep_interval_ms` (a
//! safety net, and how a server learns of deadlines another server on a shared store
//! created), and bounds each pass to [`PASS_BUDGET`] items so that a mass expiry never holds
//! the store for long: when a pass hits its budget, the store waits for that pass's writes to
//! be durable, and the sweeper goes again after [`PASS_PAUSE`]. So a mass expiry proceeds at
//! most one pass per group commit, never fills the batches that client calls wait for, and
//! spreads its deletes over time.

use super::Queue;
use super::lifecycle;
use crate::domain::{JobFacts, UnixMs};
use crate::storage::{Maintenance, StorageError, SweepPass};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Most items one pass handles before yielding.
pub const PASS_BUDGET: usize = 256;

/// The pause between passes while a backlog lasts: at most about 50,000 items a second.
pub const PASS_PAUSE: Duration = Duration::from_millis(5);

/// The sweeper's alarm: the deadline it sleeps toward, and a wake-up when a transition creates
/// an earlier one (a lease, a schedule, a retained dead letter).
#[derive(Debug)]
pub struct SweepWake {
    next: AtomicI64,
    notify: Notify,
}

impl Default for SweepWake {
    fn default() -> Self {
        SweepWake {
            next: AtomicI64::new(i64::MAX),
            notify: Notify::new(),
        }
    }
}

impl SweepWake {
    /// Wakes the sweeper if `at` is earlier than the deadline it sleeps toward.
    pub fn deadline_at(&self, at: UnixMs) {
        if at < self.next.load(Ordering::Relaxed) {
            self.next.store(at, Ordering::Relaxed);
            self.notify.notify_one();
        }
    }

    fn sleeping_toward(&self, at: Option<UnixMs>) {
        self.next.store(at.unwrap_or(i64::MAX), Ordering::Relaxed);
    }
}

/// What a pass did, and when the next one is due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// What the store did.
    pub done: Maintenance,
    /// The earliest future deadline (lease expiry, scheduled time, record expiry, end of a
    /// retention), if any.
    pub next_deadline: Option<UnixMs>,
}

impl Queue {
    /// One bounded sweeper pass at the clock's time: see the module docs. Wakes the Reserves
    /// waiting on queues that got ready jobs.
    ///
    /// # Errors
    /// [`StorageError`] from the store (`Unavailable` while it refuses writes).
    pub async fn sweep(&self, budget: usize) -> Result<SweepReport, StorageError> {
        let started = std::time::Instant::now();
        let now = self.clock.now();
        let retention = self.limits.dead_letter_retention_ms;
        let expired = |job: JobFacts<'_>| lifecycle::lease_expired(job, retention, now);
        let over = |job: JobFacts<'_>| lifecycle::dead_letter_removed(job, now);
        let done = self
            .store
            .maintain(&SweepPass {
                now,
                budget,
                retained_until: lifecycle::retained_until(retention, now),
                lease_expired: &expired,
                retention_over: &over,
            })
            .await?;
        for (queue, n) in &done.ready {
            self.signals.job_ready(queue, *n);
        }
        for (queue, n) in &done.dead_lettered_by_queue {
            self.rates
                .count(queue, super::rates::Event::DeadLettered, *n as u64, now);
        }
        let d = done.deadlines;
        let retention_ms = i64::try_from(retention).unwrap_or(i64::MAX);
        let next_deadline = [
            d.lease,
            d.scheduled,
            d.dedup,
            d.oldest_dead_letter
                .map(|at| at.saturating_add(retention_ms)),
            d.tombstone,
        ]
        .into_iter()
        .flatten()
        .min();
        self.sweep_wake.sleeping_toward(next_deadline);
        let lag_ms = next_deadline.map_or(0, |at| now.saturating_sub(at));
        self.metrics.swept(
            started.elapsed(),
            done.redelivered,
            done.promoted,
            lag_ms,
            done.more,
        );
        self.metrics.dead_lettered(
            crate::domain::DeadLetterCause::LeaseExpired,
            done.dead_lettered,
        );
        Ok(SweepReport {
            done,
            next_deadline,
        })
    }
}

/// Runs until `shutdown` is cancelled. The caller owns the task handle and awaits it at
/// shutdown.
pub async fn run(queue: Arc<Queue>, interval_ms: u64, shutdown: CancellationToken) {
    loop {
        let sleep_ms = match queue.sweep(PASS_BUDGET).await {
            Ok(r) => {
                let d = &r.done;
                if d.redelivered + d.dead_lettered + d.promoted + d.dedup_purged + d.records_purged
                    > 0
                {
                    tracing::debug!(
                        redelivered = d.redelivered,
                        dead_lettered = d.dead_lettered,
                        promoted = d.promoted,
                        dedup_purged = d.dedup_purged,
                        records_purged = d.records_purged,
                        "sweeper pass"
                    );
                }
                if d.more {
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
                    .map_or(interval_ms, |d| {
                        u64::try_from(d.saturating_sub(queue.clock.now())).unwrap_or(0)
                    })
                    .min(interval_ms)
            }
            // Refused writes (no space left, a failed write) are logged by the store once.
            Err(e @ StorageError::Unavailable(_)) => {
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
            _ = queue.sweep_wake.notify.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::{DedupClaim, JobId, NewJob, PersistMode};
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::storage::Store;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};
    use std::time::Instant;

    /// A stop during a mass expiry returns at once; the rest is swept after the restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_during_a_mass_expiry_does_not_wait_for_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_700_000_000_000;
        let clock = Arc::new(ManualClock::new(t0));
        let store = Arc::new(
            EmbeddedStore::open(
                EmbeddedOptions {
                    path: dir.path().join("data"),
                    persist_mode: PersistMode::Buffer,
                    min_free_bytes: 0,
                },
                t0,
            )
            .unwrap(),
        );
        let shutdown = CancellationToken::new();
        let queue = Arc::new(Queue::new(
            store.clone() as Arc<dyn Store>,
            Arc::new(Limits::from_config(&Config::default()).unwrap()),
            clock.clone(),
            shutdown.clone(),
        ));
        // 40,000 records that expire at once: at most PASS_BUDGET per PASS_PAUSE, so well
        // over half a second of sweeping.
        const RECORDS: u64 = 40_000;
        for chunk in 0..40 {
            let jobs: Vec<NewJob> = (0..1000)
                .map(|i| NewJob {
                    id: JobId::new_v4(),
                    queue: Arc::from("q"),
                    job_type: "t".into(),
                    payload: None,
                    priority: 0,
                    max_attempts: 1,
                    trace_context: None,
                    custom: Default::default(),
                    enqueued_at: t0,
                    scheduled_at: None,
                    dedup: Some(DedupClaim {
                        key: format!("k{chunk}-{i}"),
                        expires_at: t0 + 50,
                        fingerprint: None,
                        replace: None,
                    }),
                    max_queue_depth: None,
                    reply_bytes: 200,
                })
                .collect();
            let repeats = crate::queue::enqueue::prepass(&jobs);
            let rule = |jobs: &[NewJob], facts: &dyn crate::storage::EnqueueFacts| {
                let cap = crate::queue::enqueue::QueueCap {
                    max: u64::MAX,
                    exempt: &|_: &str| false,
                };
                crate::queue::enqueue::decide(jobs, &repeats, facts, &cap, false, t0)
            };
            store.enqueue(jobs, &rule, t0).await.unwrap();
        }
        clock.set(t0 + 50);

        let sweeper = tokio::spawn(run(queue.clone(), 1000, shutdown.clone()));
        // Stop once the sweep is under way.
        let started = Instant::now();
        while store.queue_stats("q").await.unwrap().dedup_records == RECORDS {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the sweep started"
            );
            tokio::task::yield_now().await;
        }
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
