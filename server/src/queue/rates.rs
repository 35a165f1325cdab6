//! Rates of the last hour: per-minute counts of each queue's enqueued, acked, nacked and
//! dead-lettered jobs, for the queues dashboard and `sepp queues`.
//!
//! Each server counts what it does in memory ([`Rates::count`]) and adds it to the store every
//! [`FLUSH_INTERVAL`] ([`crate::storage::Store::add_rates`]: on PostgreSQL an upsert that adds
//! to the bucket, so a bucket is the sum over every server on the database without any call
//! between servers), dropping buckets older than [`WINDOW_MINUTES`]. A read flushes this
//! server's counts first, so what it did is in the answer; another server's last few seconds
//! show at its next flush. Memory: what is not flushed yet (a few minutes × the queues that
//! moved) here, the queues × 60 buckets × 4 counters in the store.

use super::Queue;
use crate::domain::UnixMs;
use crate::error::QueueError;
use crate::storage::{RateBucket, RateCounts, StorageError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How many minutes are kept and reported, the current one included.
pub const WINDOW_MINUTES: i64 = 60;

/// How often a server adds its counts to the store.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// The minute of `at` (Unix milliseconds): Unix time in whole minutes.
pub fn minute_of(at: UnixMs) -> i64 {
    at.div_euclid(60_000)
}

/// Which count a transition adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A job was created by an enqueue.
    Enqueued,
    /// A delivery was acked.
    Acked,
    /// A delivery was nacked.
    Nacked,
    /// A job was dead-lettered.
    DeadLettered,
}

/// This server's counts not yet added to the store. Owned by the [`Queue`]; emptied by
/// [`Queue::flush_rates`].
#[derive(Debug, Default)]
pub struct Rates {
    pending: Mutex<HashMap<(i64, Arc<str>), RateCounts>>,
}

impl Rates {
    /// Adds `n` to `event`'s count of `queue` in the minute of `now`.
    pub fn count(&self, queue: &Arc<str>, event: Event, n: u64, now: UnixMs) {
        if n == 0 {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let c = pending.entry((minute_of(now), queue.clone())).or_default();
        match event {
            Event::Enqueued => c.enqueued += n,
            Event::Acked => c.acked += n,
            Event::Nacked => c.nacked += n,
            Event::DeadLettered => c.dead_lettered += n,
        }
    }

    fn take(&self) -> Vec<RateBucket> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending
            .drain()
            .map(|((minute, queue), counts)| RateBucket {
                minute,
                queue: queue.to_string(),
                counts,
            })
            .collect()
    }

    /// Puts back counts a failed flush took, so that the next flush adds them.
    fn restore(&self, buckets: Vec<RateBucket>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for b in buckets {
            pending
                .entry((b.minute, Arc::from(b.queue)))
                .or_default()
                .add(&b.counts);
        }
    }
}

/// One queue's counts of the last hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRates {
    /// The queue.
    pub queue: String,
    /// [`WINDOW_MINUTES`] buckets, oldest first; the last is the current (partial) minute.
    pub minutes: Vec<RateCounts>,
}

/// A page of the rates of the queues that moved in the last hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatesReport {
    /// The minute of the first bucket (Unix time in whole minutes).
    pub first_minute: i64,
    /// By queue name.
    pub queues: Vec<QueueRates>,
    /// Pass back to get the next page (the last queue's name); empty on the last page.
    pub next_page_token: String,
}

impl QueueRates {
    /// The counts of the last complete minute (the one before the current), the rate per
    /// minute `sepp queues` shows.
    pub fn last_minute(&self) -> RateCounts {
        let n = self.minutes.len();
        if n >= 2 {
            self.minutes[n - 2]
        } else {
            RateCounts::default()
        }
    }
}

impl Queue {
    /// Adds this server's counts to the store and drops buckets older than the window. Kept
    /// for the next flush when the store fails.
    ///
    /// # Errors
    /// The store's failure.
    pub async fn flush_rates(&self) -> Result<(), StorageError> {
        let buckets = self.rates.take();
        let keep_from = minute_of(self.clock.now()) - (WINDOW_MINUTES - 1);
        // Buckets older than the window would be dropped by the store at once.
        let buckets: Vec<RateBucket> = buckets
            .into_iter()
            .filter(|b| b.minute >= keep_from)
            .collect();
        if let Err(e) = self.store.add_rates(&buckets, keep_from).await {
            self.rates.restore(buckets);
            return Err(e);
        }
        Ok(())
    }

    /// The per-minute counts of the last [`WINDOW_MINUTES`] minutes of every queue that moved
    /// in them (or of `queue` only), summed over every server on the store, after adding this
    /// server's own: one page of up to `page_size` queues (default and at most 1000) after the
    /// name `page_token`, shorter when more would pass the reply budget
    /// (`max_reserve_reply_bytes`).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a malformed queue name, `page_size = 0` or a token
    /// longer than a queue name may be; [`QueueError::Storage`].
    pub async fn queue_rates(
        &self,
        queue: Option<&str>,
        page_size: Option<u32>,
        page_token: &str,
    ) -> Result<RatesReport, QueueError> {
        if let Some(q) = queue {
            self.check_queue_name("queue", q, super::validate::NameUse::Read)?;
        }
        let limit = match page_size {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "page_size is 0: ask for at least 1 queue".into(),
                ));
            }
            Some(n) => n.min(super::admin::MAX_PAGE) as usize,
            None => super::admin::MAX_PAGE as usize,
        };
        if page_token.len() > self.limits.max_queue_name_bytes as usize {
            return Err(QueueError::InvalidArgument(format!(
                "page_token ({} bytes) is not a token this server issued (a queue name of at most \
                 max_queue_name_bytes = {})",
                page_token.len(),
                self.limits.max_queue_name_bytes
            )));
        }
        self.flush_rates().await?;
        let first_minute = minute_of(self.clock.now()) - (WINDOW_MINUTES - 1);
        let mut by_queue: std::collections::BTreeMap<String, Vec<RateCounts>> = Default::default();
        for b in self.store.rates(first_minute).await? {
            if queue.is_some_and(|q| q != b.queue)
                || b.counts.is_zero()
                || (!page_token.is_empty() && b.queue.as_str() <= page_token)
            {
                continue;
            }
            let Ok(i) = usize::try_from(b.minute - first_minute) else {
                continue;
            };
            if i >= WINDOW_MINUTES as usize {
                continue;
            }
            by_queue
                .entry(b.queue)
                .or_insert_with(|| vec![RateCounts::default(); WINDOW_MINUTES as usize])[i]
                .add(&b.counts);
        }
        let mut queues: Vec<QueueRates> = by_queue
            .into_iter()
            .map(|(queue, minutes)| QueueRates { queue, minutes })
            .collect();
        let mut more = queues.len() > limit;
        queues.truncate(limit);
        let fit = super::reply::listing_fit(
            queues.iter().map(|q| {
                super::reply::queue_rates_fixed(WINDOW_MINUTES as u64) + q.queue.len() as u64
            }),
            u64::from(self.limits.max_queue_name_bytes),
            self.limits.max_reserve_reply_bytes,
        );
        if fit < queues.len() {
            queues.truncate(fit);
            more = true;
        }
        let next_page_token = match (more, queues.last()) {
            (true, Some(q)) => q.queue.clone(),
            _ => String::new(),
        };
        Ok(RatesReport {
            first_minute,
            queues,
            next_page_token,
        })
    }
}

/// Flushes the queue's rates every [`FLUSH_INTERVAL`] until `shutdown`, then once more.
pub async fn run(queue: Arc<Queue>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(FLUSH_INTERVAL) => {}
        }
        if let Err(e) = queue.flush_rates().await {
            tracing::warn!(error = %e, "cannot add this server's rates to the store; kept for the next try");
        }
    }
    if let Err(e) = queue.flush_rates().await {
        tracing::warn!(error = %e, "cannot add this server's last rates to the store");
    }
}
