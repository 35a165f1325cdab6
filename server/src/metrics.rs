//! Prometheus metrics (`[metrics]`, `docs/operations.md`).
//!
//! One [`Metrics`] per server, with its own registry (`prometheus-client`): several servers in
//! one process (tests, an embedding application) keep separate counts, and nothing is global.
//!
//! - **Counters and histograms** are this process's: the queue layer (`queue/`) and the gRPC
//!   edge (`api/`) call the `record` methods below, one line at each place; the store reports
//!   its commits through [`crate::storage::CommitObserver`].
//! - **Gauges** are not kept here: each scrape reads them from the store
//!   ([`crate::storage::Store::gauges`]), so a second server on the same database reports the
//!   same numbers. They are named `sepp_store_*`: store-wide, to be taken with `max` over
//!   servers, never `sum` (`docs/operations.md` has the PromQL).
//! - **Label cardinality** is bounded: `queue` takes the declared `[[queues]]`, then the first
//!   `max_queue_labels` others seen; past that a queue is counted under `queue="_other"`.
//!   `reason`, `cause`, `rpc`, `code` and `state` are closed sets.
//!
//! Off (`[metrics] enabled = false`, the default), every `record` method returns at once.

use crate::domain::{DeadLetterCause, UnixMs};
use crate::storage::{CommitObserver, StoreGauges};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The `queue` label of a queue past `max_queue_labels`.
pub const OTHER_QUEUE: &str = "_other";

type QueueLabel = [(&'static str, String); 1];
type Labels2 = [(&'static str, String); 2];
type StaticLabel = [(&'static str, &'static str); 1];

/// The connection layer's budgets at a scrape ([`Metrics::set_buffers`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Buffers {
    /// Bytes of partly received request messages (`server.request_buffer_bytes`).
    pub request_held: u64,
    /// Calls refused for want of request buffer since start.
    pub request_refused: u64,
    /// Bytes of replies not yet written (`server.reply_buffer_bytes`).
    pub reply_held: u64,
    /// Calls refused for want of reply buffer since start.
    pub reply_refused: u64,
}

/// Which queues get their own label value.
struct QueueLabels {
    declared: HashSet<String>,
    seen: RwLock<HashSet<String>>,
    max: usize,
}

impl QueueLabels {
    fn label(&self, queue: &str) -> String {
        if self.declared.contains(queue) {
            return queue.to_string();
        }
        {
            let seen = self.seen.read().unwrap_or_else(|e| e.into_inner());
            if seen.contains(queue) {
                return queue.to_string();
            }
            if seen.len() + self.declared.len() >= self.max {
                return OTHER_QUEUE.to_string();
            }
        }
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        if seen.contains(queue) || seen.len() + self.declared.len() < self.max {
            seen.insert(queue.to_string());
            queue.to_string()
        } else {
            OTHER_QUEUE.to_string()
        }
    }

    /// The label of a queue in a scrape of the store: declared queues, then the others in name
    /// order until `max`.
    fn store_labels<'a>(&self, names: impl Iterator<Item = &'a str>) -> Vec<String> {
        let mut others = self.max.saturating_sub(self.declared.len());
        names
            .map(|n| {
                if self.declared.contains(n) {
                    n.to_string()
                } else if others > 0 {
                    others -= 1;
                    n.to_string()
                } else {
                    OTHER_QUEUE.to_string()
                }
            })
            .collect()
    }
}

/// The server's metrics: see the module docs.
pub struct Metrics {
    enabled: bool,
    queues: QueueLabels,
    registry: Registry,
    enqueued: Family<QueueLabel, Counter>,
    deduplicated: Family<QueueLabel, Counter>,
    rejected: Family<StaticLabel, Counter>,
    reserved: Family<QueueLabel, Counter>,
    acked: Family<QueueLabel, Counter>,
    nacked: Family<QueueLabel, Counter>,
    dead_lettered: Family<StaticLabel, Counter>,
    redelivered: Counter,
    promoted: Counter,
    rpc_duration: Family<Labels2, Histogram>,
    commit_writes: Histogram,
    commit_duration: Histogram,
    sweep_duration: Histogram,
    sweep_lag: Gauge<f64, AtomicU64>,
    sweep_more: Gauge,
    reserves_waiting: Gauge,
    buffer_held: Family<StaticLabel, Gauge>,
    buffer_refused: Family<StaticLabel, Counter>,
    // Store-wide gauges, refilled at each scrape.
    store_jobs: Family<Labels2, Gauge>,
    store_paused: Family<QueueLabel, Gauge>,
    store_oldest_ready: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    store_dedup: Family<QueueLabel, Gauge>,
    store_dedup_total: Gauge,
    store_dedup_age: Gauge<f64, AtomicU64>,
    scraping: std::sync::Mutex<()>,
}

fn cause_name(c: DeadLetterCause) -> &'static str {
    match c {
        DeadLetterCause::AttemptsExhausted => "attempts_exhausted",
        DeadLetterCause::Rejected => "rejected",
        DeadLetterCause::LeaseExpired => "lease_expired",
        DeadLetterCause::Admin => "admin",
    }
}

impl Metrics {
    /// Metrics that record nothing (`[metrics] enabled = false`).
    pub fn disabled() -> Arc<Self> {
        Arc::new(Self::new(false, std::iter::empty::<String>(), 1))
    }

    /// Metrics for a server whose declared queues are `declared`; `max_queue_labels` bounds
    /// the `queue` label. `enabled = false` records nothing.
    pub fn new(
        enabled: bool,
        declared: impl IntoIterator<Item = String>,
        max_queue_labels: usize,
    ) -> Self {
        let mut r = Registry::with_prefix("sepp");
        let enqueued = Family::default();
        r.register(
            "jobs_enqueued",
            "Jobs created by enqueues (not deduplicated), per queue",
            enqueued.clone(),
        );
        let deduplicated = Family::default();
        r.register(
            "jobs_deduplicated",
            "Enqueues answered by a live dedup record (no job created), per queue",
            deduplicated.clone(),
        );
        let rejected = Family::default();
        r.register(
            "jobs_rejected",
            "Jobs of enqueue requests rejected, per reason",
            rejected.clone(),
        );
        let reserved = Family::default();
        r.register(
            "jobs_reserved",
            "Deliveries handed out by Reserve, per queue",
            reserved.clone(),
        );
        let acked = Family::default();
        r.register("jobs_acked", "Deliveries acked, per queue", acked.clone());
        let nacked = Family::default();
        r.register(
            "jobs_nacked",
            "Deliveries nacked, per queue",
            nacked.clone(),
        );
        let dead_lettered = Family::default();
        r.register(
            "jobs_dead_lettered",
            "Jobs dead-lettered, per cause",
            dead_lettered.clone(),
        );
        let redelivered = Counter::default();
        r.register(
            "jobs_redelivered",
            "Jobs made ready again by the sweeper after their lease expired",
            redelivered.clone(),
        );
        let promoted = Counter::default();
        r.register(
            "jobs_promoted",
            "Scheduled jobs made ready by the sweeper",
            promoted.clone(),
        );
        let rpc_duration = Family::<Labels2, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
        });
        r.register_with_unit(
            "rpc_duration",
            "Time to answer a gRPC call, per RPC and status code (a Reserve's wait included)",
            Unit::Seconds,
            rpc_duration.clone(),
        );
        let commit_writes = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        r.register(
            "storage_commit_writes",
            "Writes per group commit (one fsync each in sync modes)",
            commit_writes.clone(),
        );
        let commit_duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        r.register_with_unit(
            "storage_commit_duration",
            "Time to write and fsync one group commit",
            Unit::Seconds,
            commit_duration.clone(),
        );
        let sweep_duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        r.register_with_unit(
            "sweeper_pass_duration",
            "Time of one sweeper pass",
            Unit::Seconds,
            sweep_duration.clone(),
        );
        let sweep_lag = Gauge::<f64, AtomicU64>::default();
        r.register_with_unit(
            "sweeper_lag",
            "After the last pass: how long the earliest due deadline (lease, schedule, record \
             expiry) has been due, 0 when nothing is overdue",
            Unit::Seconds,
            sweep_lag.clone(),
        );
        let sweep_more = Gauge::default();
        r.register(
            "sweeper_backlog",
            "1 when the last sweeper pass stopped at its budget with more work due",
            sweep_more.clone(),
        );
        let reserves_waiting = Gauge::default();
        r.register(
            "reserves_waiting",
            "Reserves of this server waiting for a job now, at the scrape (capped by \
             limits.max_waiting_reserves)",
            reserves_waiting.clone(),
        );
        let buffer_held = Family::default();
        r.register_with_unit(
            "buffer_held",
            "Bytes held now in the connection layer's budgets: buffer=\"request\" partly \
             received request messages (server.request_buffer_bytes), buffer=\"reply\" replies \
             not yet written to their connections (server.reply_buffer_bytes)",
            Unit::Bytes,
            buffer_held.clone(),
        );
        let buffer_refused = Family::default();
        r.register(
            "buffer_refused",
            "Calls answered RESOURCE_EXHAUSTED because a connection-layer budget \
             (buffer=\"request\" or \"reply\") was held",
            buffer_refused.clone(),
        );
        let store_jobs = Family::default();
        r.register(
            "store_queue_jobs",
            "Store-wide: jobs per queue and state (ready, scheduled, in_flight, dead_lettered); \
             every server reports the same value, take max over servers",
            store_jobs.clone(),
        );
        let store_paused = Family::default();
        r.register(
            "store_queue_paused",
            "Store-wide: 1 when the queue is paused",
            store_paused.clone(),
        );
        let store_oldest_ready = Family::default();
        r.register_with_unit(
            "store_queue_oldest_ready_age",
            "Store-wide: age of the queue's oldest ready job (0 when none is ready)",
            Unit::Seconds,
            store_oldest_ready.clone(),
        );
        let store_dedup = Family::default();
        r.register(
            "store_dedup_records",
            "Store-wide: dedup records per queue (live, or expired and not yet swept)",
            store_dedup.clone(),
        );
        let store_dedup_total = Gauge::default();
        r.register(
            "store_dedup_records_all",
            "Store-wide: dedup records of all queues",
            store_dedup_total.clone(),
        );
        let store_dedup_age = Gauge::<f64, AtomicU64>::default();
        r.register_with_unit(
            "store_dedup_oldest_age",
            "Store-wide: age of the dedup record that expires next (the oldest when every \
             queue has the same window), 0 when there is none",
            Unit::Seconds,
            store_dedup_age.clone(),
        );
        Metrics {
            enabled,
            queues: QueueLabels {
                declared: declared.into_iter().collect(),
                seen: RwLock::new(HashSet::new()),
                max: max_queue_labels,
            },
            registry: r,
            enqueued,
            deduplicated,
            rejected,
            reserved,
            acked,
            nacked,
            dead_lettered,
            redelivered,
            promoted,
            rpc_duration,
            commit_writes,
            commit_duration,
            sweep_duration,
            sweep_lag,
            sweep_more,
            reserves_waiting,
            buffer_held,
            buffer_refused,
            store_jobs,
            store_paused,
            store_oldest_ready,
            store_dedup,
            store_dedup_total,
            store_dedup_age,
            scraping: std::sync::Mutex::new(()),
        }
    }

    /// The Reserves of this server waiting now (set at each scrape).
    pub fn set_reserves_waiting(&self, n: u64) {
        self.reserves_waiting
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The connection layer's budgets (set at each scrape, before the store's gauges).
    pub fn set_buffers(&self, b: &Buffers) {
        let _turn = self.scraping.lock().unwrap_or_else(|e| e.into_inner());
        for (name, held, refused) in [
            ("request", b.request_held, b.request_refused),
            ("reply", b.reply_held, b.reply_refused),
        ] {
            let label = [("buffer", name)];
            self.buffer_held
                .get_or_create(&label)
                .set(i64::try_from(held).unwrap_or(i64::MAX));
            let counter = self.buffer_refused.get_or_create(&label);
            counter.inc_by(refused.saturating_sub(counter.get()));
        }
    }

    /// Whether anything is recorded.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn per_queue(&self, f: &Family<QueueLabel, Counter>, queue: &str, n: u64) {
        if self.enabled && n > 0 {
            f.get_or_create(&[("queue", self.queues.label(queue))])
                .inc_by(n);
        }
    }

    /// An enqueue created a job on `queue`, or (`deduplicated`) answered with an existing one.
    pub fn enqueued(&self, queue: &str, deduplicated: bool) {
        let f = if deduplicated {
            &self.deduplicated
        } else {
            &self.enqueued
        };
        self.per_queue(f, queue, 1);
    }

    /// A job of an enqueue was rejected for `reason` ([`crate::queue::model::Rejection::kind`]).
    pub fn rejected(&self, reason: &'static str) {
        if self.enabled {
            self.rejected.get_or_create(&[("reason", reason)]).inc();
        }
    }

    /// Reserve handed out `n` deliveries of `queue`.
    pub fn reserved(&self, queue: &str, n: u64) {
        self.per_queue(&self.reserved, queue, n);
    }

    /// A delivery of `queue` was acked.
    pub fn acked(&self, queue: &str) {
        self.per_queue(&self.acked, queue, 1);
    }

    /// A delivery of `queue` was nacked.
    pub fn nacked(&self, queue: &str) {
        self.per_queue(&self.nacked, queue, 1);
    }

    /// `n` jobs were dead-lettered with `cause`.
    pub fn dead_lettered(&self, cause: DeadLetterCause, n: u64) {
        if self.enabled && n > 0 {
            self.dead_lettered
                .get_or_create(&[("cause", cause_name(cause))])
                .inc_by(n);
        }
    }

    /// A sweeper pass took `took`, redelivered `redelivered` expired leases, promoted
    /// `promoted` scheduled jobs, and left the earliest due deadline `lag_ms` overdue;
    /// `more`: it stopped at its budget.
    pub fn swept(&self, took: Duration, redelivered: u64, promoted: u64, lag_ms: i64, more: bool) {
        if !self.enabled {
            return;
        }
        self.sweep_duration.observe(took.as_secs_f64());
        self.redelivered.inc_by(redelivered);
        self.promoted.inc_by(promoted);
        self.sweep_lag.set(lag_ms.max(0) as f64 / 1000.0);
        self.sweep_more.set(i64::from(more));
    }

    /// A gRPC call `rpc` (a method name of the services, a closed set) was answered with
    /// `code` after `took`.
    pub fn rpc(&self, rpc: String, code: &'static str, took: Duration) {
        if self.enabled {
            self.rpc_duration
                .get_or_create(&[("rpc", rpc), ("code", code.to_string())])
                .observe(took.as_secs_f64());
        }
    }

    /// One scrape: refills the store-wide gauges from `g` (read at `now`) and renders every
    /// metric in the OpenMetrics text format (which Prometheus scrapes). Scrapes take turns.
    pub fn scrape(&self, g: &StoreGauges, now: UnixMs) -> String {
        let _turn = self.scraping.lock().unwrap_or_else(|e| e.into_inner());
        self.set_store_gauges(g, now);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    fn set_store_gauges(&self, g: &StoreGauges, now: UnixMs) {
        self.store_jobs.clear();
        self.store_paused.clear();
        self.store_oldest_ready.clear();
        self.store_dedup.clear();
        let labels = self
            .queues
            .store_labels(g.queues.iter().map(|q| q.queue.as_str()));
        let age = |at: Option<UnixMs>| at.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
        for (q, label) in g.queues.iter().zip(labels) {
            let s = &q.stats;
            for (state, n) in [
                ("ready", s.ready),
                ("scheduled", s.scheduled),
                ("in_flight", s.in_flight),
                ("dead_lettered", s.dead_lettered),
            ] {
                self.store_jobs
                    .get_or_create(&[("queue", label.clone()), ("state", state.to_string())])
                    .inc_by(i64::try_from(n).unwrap_or(i64::MAX));
            }
            let l = [("queue", label)];
            self.store_paused
                .get_or_create(&l)
                .inc_by(i64::from(s.paused));
            let a = age(q.oldest_ready_at);
            let g = self.store_oldest_ready.get_or_create(&l);
            if a > g.get() {
                g.set(a);
            }
            drop(g);
            self.store_dedup
                .get_or_create(&l)
                .inc_by(i64::try_from(s.dedup_records).unwrap_or(i64::MAX));
        }
        self.store_dedup_total
            .set(i64::try_from(g.dedup_records).unwrap_or(i64::MAX));
        self.store_dedup_age
            .set(age(g.next_expiring_dedup_created_at));
    }
}

impl CommitObserver for Metrics {
    fn committed(&self, writes: usize, took: Duration) {
        if self.enabled {
            self.commit_writes.observe(writes as f64);
            self.commit_duration.observe(took.as_secs_f64());
        }
    }
}

/// The content type of [`Metrics::scrape`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` until `stop`: each scrape reads the store's gauges
/// through `gauges` and renders every metric.
pub async fn serve<F, Fut>(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    gauges: F,
    stop: tokio_util::sync::CancellationToken,
) where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(StoreGauges, UnixMs), String>> + Send,
{
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            let gauges = gauges.clone();
            async move {
                match gauges().await {
                    Ok((g, now)) => (
                        [(header::CONTENT_TYPE, CONTENT_TYPE)],
                        metrics.scrape(&g, now),
                    )
                        .into_response(),
                    Err(e) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot read the store's gauges: {e}\n"),
                    )
                        .into_response(),
                }
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
    {
        tracing::error!(error = %e, "metrics endpoint stopped");
    }
}
