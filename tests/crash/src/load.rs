//! The mixed load: keyed producers that retry with the same keys after any error, keyed
//! batches (best effort and atomic), unkeyed producers, debouncers (several versions of one
//! key on the debounce queue, each replacing the pending job's payload), and workers that ack, nack, nack with
//! a delay, dead-letter, extend, and let leases expire. Every outcome goes to the [`Model`].
//!
//! Each call holds the gate's read side; the driver takes the write side after a kill, so
//! that nothing is in flight while it restarts the server and verifies.

use crate::model::{
    DEBOUNCE_KEY_ENTRY, DEBOUNCE_PREFIX, DEBOUNCE_QUEUE, JOB_TYPE, Model, QUEUE, payload,
};
use rand::RngExt;
use sepp_rs::{EnqueueError, EnqueueRequest, NackRetry, ReserveOptions, SeppClient};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::RwLock;
use tokio::task::JoinHandle;

/// The lease workers ask for.
pub const LEASE: Duration = Duration::from_millis(1500);
/// Producers wait while the queue holds more jobs than this (ready, scheduled or in
/// flight), so that the workers keep up and the final drain is short.
const MAX_BACKLOG: u64 = 400;
/// Jobs a worker settles at once.
const IN_HAND: usize = 8;
/// Pause after a failed call (pacing only: the server is down or refusing).
const AFTER_ERROR: Duration = Duration::from_millis(20);

/// The running load.
pub struct Load {
    /// Held (write) by the driver while the server is down and being verified.
    pub gate: Arc<RwLock<()>>,
    stop_producers: Arc<AtomicBool>,
    stop_workers: Arc<AtomicBool>,
    producers: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

struct Ctx {
    client: SeppClient,
    model: Arc<Model>,
    gate: Arc<RwLock<()>>,
    stop: Arc<AtomicBool>,
    /// The queue's depth, as last read.
    depth: Arc<AtomicU64>,
}

/// How many tasks of each kind.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Keyed single-job producers.
    pub keyed: usize,
    /// Keyed batch producers.
    pub batches: usize,
    /// Unkeyed producers.
    pub unkeyed: usize,
    /// Debouncers (keyed, on the debounce queue).
    pub debouncers: usize,
    /// Workers.
    pub workers: usize,
}

impl Load {
    /// Starts the tasks.
    pub fn start(client: &SeppClient, model: &Arc<Model>, mix: Mix) -> Load {
        let gate = Arc::new(RwLock::new(()));
        let stop_producers = Arc::new(AtomicBool::new(false));
        let stop_workers = Arc::new(AtomicBool::new(false));
        let depth = Arc::new(AtomicU64::new(0));
        let ctx = |stop: &Arc<AtomicBool>| {
            Arc::new(Ctx {
                client: client.clone(),
                model: model.clone(),
                gate: gate.clone(),
                stop: stop.clone(),
                depth: depth.clone(),
            })
        };
        let mut producers = Vec::new();
        for i in 0..mix.keyed {
            producers.push(tokio::spawn(keyed(ctx(&stop_producers), i)));
        }
        for i in 0..mix.batches {
            producers.push(tokio::spawn(batches(ctx(&stop_producers), i)));
        }
        for i in 0..mix.unkeyed {
            producers.push(tokio::spawn(unkeyed(ctx(&stop_producers), i)));
        }
        for i in 0..mix.debouncers {
            producers.push(tokio::spawn(debouncer(ctx(&stop_producers), i)));
        }
        let mut workers: Vec<JoinHandle<()>> = (0..mix.workers)
            .map(|i| tokio::spawn(worker(ctx(&stop_workers), i)))
            .collect();
        workers.push(tokio::spawn(watch_depth(ctx(&stop_workers))));
        Load {
            gate,
            stop_producers,
            stop_workers,
            producers,
            workers,
        }
    }

    /// Stops the producers (each finishes the keys it is retrying first).
    pub async fn stop_producers(&mut self) {
        self.stop_producers.store(true, Ordering::Relaxed);
        for p in self.producers.drain(..) {
            let _ = p.await;
        }
    }

    /// Stops the workers.
    pub async fn stop_workers(&mut self) {
        self.stop_workers.store(true, Ordering::Relaxed);
        for w in self.workers.drain(..) {
            let _ = w.await;
        }
    }
}

/// Reads the queue's depth every 100 ms, for the producers' backpressure.
async fn watch_depth(cx: Arc<Ctx>) {
    while !cx.stop.load(Ordering::Relaxed) {
        let r = {
            let _g = cx.gate.read().await;
            cx.client.get_queue_stats(QUEUE).await
        };
        if let Ok(s) = r {
            cx.depth
                .store(s.ready + s.scheduled + s.in_flight, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn batch_error(e: &sepp_rs::BatchError) -> (Option<i32>, String) {
    match e {
        sepp_rs::BatchError::Client(c) => (c.grpc_code(), c.message().to_string()),
        other => (None, other.to_string()),
    }
}

async fn backpressure(cx: &Ctx) {
    while cx.depth.load(Ordering::Relaxed) > MAX_BACKLOG && !cx.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn job(rng: &mut impl RngExt, key: Option<&str>) -> (EnqueueRequest, u64, u32) {
    let seed: u64 = rng.random();
    let max_attempts = rng.random_range(1..=5);
    let len = rng.random_range(0..2048);
    let mut req = EnqueueRequest::new(QUEUE, JOB_TYPE)
        .expect("valid names")
        .with_payload(payload(seed, len), "application/octet-stream")
        .with_max_attempts(max_attempts)
        .with_priority(rng.random_range(0..=9));
    if rng.random_bool(0.1) {
        req = req.with_scheduled_at(
            SystemTime::now() + Duration::from_millis(rng.random_range(50..500)),
        );
    }
    if let Some(k) = key {
        req = req.with_idempotency_key(k);
    }
    (req, seed, max_attempts)
}

/// One keyed job at a time; after any error the same key again, until it is acknowledged.
async fn keyed(cx: Arc<Ctx>, i: usize) {
    let mut rng = crate::model::new_rng();
    while !cx.stop.load(Ordering::Relaxed) {
        backpressure(&cx).await;
        let key = cx.model.next_key(&format!("k{i}"));
        let (req, seed, max) = job(&mut rng, Some(&key));
        loop {
            let r = {
                let _g = cx.gate.read().await;
                cx.model.key_tried(&key);
                cx.client.enqueue(req.clone()).await
            };
            match r {
                Ok(ack) => {
                    cx.model
                        .enqueued(Some(&key), &ack.job_id, ack.deduplicated, seed, max);
                    break;
                }
                Err(EnqueueError::Rejected(r)) => {
                    cx.model.violation(format!("key {key}: rejected: {r}"));
                    break;
                }
                Err(EnqueueError::Client(e)) => {
                    cx.model.failed(e.grpc_code(), e.message());
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
        }
    }
}

/// Batches of keyed jobs, best effort or atomic (sometimes with a key twice: the second is a
/// dedup hit of the first); after any error the whole batch again with the same keys.
async fn batches(cx: Arc<Ctx>, i: usize) {
    let mut rng = crate::model::new_rng();
    while !cx.stop.load(Ordering::Relaxed) {
        backpressure(&cx).await;
        let n = rng.random_range(2..=8);
        let mut jobs = Vec::new();
        for _ in 0..n {
            let key = cx.model.next_key(&format!("b{i}"));
            let (req, seed, max) = job(&mut rng, Some(&key));
            jobs.push((key, req, seed, max));
        }
        if rng.random_bool(0.2) {
            let mut dup = jobs[0].clone();
            let (req, seed, max) = job(&mut rng, Some(&dup.0));
            (dup.1, dup.2, dup.3) = (req, seed, max);
            jobs.push(dup);
        }
        let atomic = rng.random_bool(0.5);
        let reqs: Vec<EnqueueRequest> = jobs.iter().map(|j| j.1.clone()).collect();
        loop {
            let r = {
                let _g = cx.gate.read().await;
                for j in &jobs {
                    cx.model.key_tried(&j.0);
                }
                let r = if atomic {
                    cx.client
                        .enqueue_atomic(reqs.clone())
                        .await
                        .map(|r| r.map_err(|e| format!("{e:?}")))
                } else {
                    cx.client.enqueue_batch(reqs.clone()).await.map(|rs| {
                        rs.into_iter()
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| e.to_string())
                    })
                };
                r.map_err(|e| batch_error(&e))
            };
            match r {
                Ok(Ok(acks)) => {
                    for ((key, _, seed, max), ack) in jobs.iter().zip(acks) {
                        cx.model
                            .enqueued(Some(key), &ack.job_id, ack.deduplicated, *seed, *max);
                    }
                    break;
                }
                Ok(Err(rejections)) => {
                    cx.model
                        .violation(format!("batch of {n} keyed jobs rejected: {rejections}"));
                    break;
                }
                Err(e) => {
                    cx.model.failed(e.0, &e.1);
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
        }
    }
}

/// Debounce: one key at a time on the debounce queue, sent in 1–5 versions (each its own
/// payload, all with the key's priority and `max_attempts`), each retried after any error
/// until acknowledged before the next is sent. A version that reaches the job while it is
/// still pending replaces its payload (`replaced = true`); the checker verifies that every
/// delivery carries a version sent for the key, whole, and never one older than a
/// replacement acknowledged before the reserve was sent, across kills and power cuts.
async fn debouncer(cx: Arc<Ctx>, i: usize) {
    let mut rng = crate::model::new_rng();
    while !cx.stop.load(Ordering::Relaxed) {
        backpressure(&cx).await;
        let key = cx.model.next_key(&format!("{DEBOUNCE_PREFIX}{i}"));
        let versions = rng.random_range(1..=5);
        let max = rng.random_range(1..=5);
        let priority = rng.random_range(0..=9);
        for version in 0..versions {
            let seed: u64 = rng.random();
            let len = rng.random_range(0..2048);
            let mut req = EnqueueRequest::new(DEBOUNCE_QUEUE, JOB_TYPE)
                .expect("valid names")
                .with_payload(payload(seed, len), "application/octet-stream")
                .with_max_attempts(max)
                .with_priority(priority)
                .with_idempotency_key(&key)
                .with_custom_entry(DEBOUNCE_KEY_ENTRY, key.as_str());
            if rng.random_bool(0.2) {
                req = req.with_scheduled_at(
                    SystemTime::now() + Duration::from_millis(rng.random_range(50..300)),
                );
            }
            cx.model.debounce_sending(&key, seed);
            loop {
                let r = {
                    let _g = cx.gate.read().await;
                    cx.model.key_tried(&key);
                    cx.client.enqueue(req.clone()).await
                };
                match r {
                    Ok(ack) => {
                        cx.model.debounce_enqueued(
                            &key,
                            &ack.job_id,
                            ack.deduplicated,
                            ack.replaced,
                            version,
                            max,
                        );
                        break;
                    }
                    Err(EnqueueError::Rejected(r)) => {
                        cx.model.violation(format!("key {key}: rejected: {r}"));
                        break;
                    }
                    Err(EnqueueError::Client(e)) => {
                        cx.model.failed(e.grpc_code(), e.message());
                        tokio::time::sleep(AFTER_ERROR).await;
                    }
                }
            }
            if cx.stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
}

/// Unkeyed jobs, one or a batch at a time; an error leaves their fate unknown (not retried).
async fn unkeyed(cx: Arc<Ctx>, _i: usize) {
    let mut rng = crate::model::new_rng();
    while !cx.stop.load(Ordering::Relaxed) {
        backpressure(&cx).await;
        let n = if rng.random_bool(0.5) {
            1
        } else {
            rng.random_range(2..=4)
        };
        let jobs: Vec<(EnqueueRequest, u64, u32)> = (0..n).map(|_| job(&mut rng, None)).collect();
        let r = {
            let _g = cx.gate.read().await;
            cx.client
                .enqueue_batch(jobs.iter().map(|j| j.0.clone()).collect())
                .await
        };
        match r {
            Ok(results) => {
                for ((_, seed, max), res) in jobs.iter().zip(results) {
                    match res {
                        Ok(ack) => {
                            cx.model
                                .enqueued(None, &ack.job_id, ack.deduplicated, *seed, *max)
                        }
                        Err(e) => cx.model.violation(format!("unkeyed job rejected: {e}")),
                    }
                }
            }
            Err(e) => {
                for _ in 0..n {
                    cx.model.enqueue_unknown();
                }
                let (code, msg) = batch_error(&e);
                cx.model.failed(code, &msg);
                tokio::time::sleep(AFTER_ERROR).await;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Ack,
    /// Ack with `then_reserve`: the ack brings the worker's next job.
    AckThenReserve,
    Nack(NackRetry),
    ExtendThenAck,
    ExtendThenNack,
    /// Let the lease run out.
    Expire,
    /// Work for a while (sometimes past the lease), then ack.
    SlowAck,
}

fn pick(rng: &mut impl RngExt) -> Action {
    match rng.random_range(0..100) {
        0..20 => Action::AckThenReserve,
        20..45 => Action::Ack,
        45..55 => Action::Nack(NackRetry::Default),
        55..65 => Action::Nack(NackRetry::Delay(Duration::from_millis(
            rng.random_range(50..400),
        ))),
        65..68 => Action::Nack(NackRetry::DeadLetter),
        68..80 => Action::ExtendThenAck,
        80..85 => Action::ExtendThenNack,
        85..95 => Action::Expire,
        _ => Action::SlowAck,
    }
}

async fn worker(cx: Arc<Ctx>, i: usize) {
    let mut rng = crate::model::new_rng();
    let worker_id = format!("w{i}");
    let mut running = tokio::task::JoinSet::new();
    while !cx.stop.load(Ordering::Relaxed) {
        while running.len() >= IN_HAND {
            running.join_next().await;
        }
        let opts = ReserveOptions::new([QUEUE, DEBOUNCE_QUEUE], LEASE)
            .with_wait_timeout(Duration::from_millis(300))
            .with_max_jobs(rng.random_range(1..=4))
            .with_worker_id(worker_id.clone());
        let (r, sent) = {
            let _g = cx.gate.read().await;
            let sent = SystemTime::now();
            (cx.client.reserve(opts).await, sent)
        };
        let jobs = match r {
            Ok(jobs) => jobs,
            Err(e) => {
                match &e {
                    sepp_rs::ReserveError::Client(c) => cx.model.failed(c.grpc_code(), c.message()),
                    other => cx.model.failed(None, &other.to_string()),
                }
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        };
        for j in &jobs {
            cx.model.delivered(j, sent);
        }
        // Each job settled by its own task, as a worker with a handler per job would; a job an
        // ack brings is settled next by the same task.
        for j in jobs {
            let cx = cx.clone();
            let worker_id = worker_id.clone();
            running.spawn(async move { settle_chain(&cx, j, &worker_id).await });
        }
    }
    while running.join_next().await.is_some() {}
}

/// How long a slow ack works first: sometimes past the lease.
fn work_time(rng: &mut impl RngExt) -> Duration {
    Duration::from_millis(rng.random_range(0..(LEASE.as_millis() as u64 * 6 / 5)))
}

/// Settles `job`, then each job an ack brings, until an ack brings none or the load stops
/// (a job brought after that is left to expire).
async fn settle_chain(cx: &Ctx, job: sepp_rs::Job, worker_id: &str) {
    let mut rng = crate::model::new_rng();
    let mut next = Some(job);
    while let Some(j) = next.take() {
        let (action, work) = (pick(&mut rng), work_time(&mut rng));
        next = settle(cx, &j.id, j.attempt, action, work, worker_id).await;
        if cx.stop.load(Ordering::Relaxed) {
            break;
        }
    }
}

/// Settles one delivery; `work`: how long a slow ack works first (sometimes past the lease).
/// Returns the job an ack brought (none unless `AckThenReserve` took), recorded as delivered.
async fn settle(
    cx: &Ctx,
    id: &str,
    attempt: u32,
    action: Action,
    work: Duration,
    worker_id: &str,
) -> Option<sepp_rs::Job> {
    let m = &cx.model;
    let outcome = |r: Result<(), sepp_rs::LeaseError>| match r {
        Ok(()) => true,
        Err(e) if e.is_lease_lost() => {
            m.lease_lost();
            false
        }
        Err(e) => {
            match &e {
                sepp_rs::LeaseError::Client(c) => m.failed(c.grpc_code(), c.message()),
                other => m.failed(None, &other.to_string()),
            }
            false
        }
    };
    let ack = async || {
        let r = {
            let _g = cx.gate.read().await;
            m.settling(id, attempt, true);
            cx.client.ack(id, attempt).await
        };
        if outcome(r) {
            m.acked(id, attempt);
        }
    };
    let nack = async |retry: NackRetry| {
        let r = {
            let _g = cx.gate.read().await;
            m.settling(id, attempt, false);
            cx.client
                .nack(id, attempt, retry, Some("crash loop".into()))
                .await
        };
        if let Ok(dead) = &r {
            m.nacked(id, attempt, matches!(retry, NackRetry::DeadLetter), *dead);
        }
        outcome(r.map(|_| ()));
    };
    let extend = async || {
        let r = {
            let _g = cx.gate.read().await;
            cx.client.extend(id, attempt, LEASE).await
        };
        match r {
            Ok(until) => {
                m.extended(id, attempt, until);
                true
            }
            Err(e) => outcome(Err(e)),
        }
    };
    let mut brought = None;
    match action {
        Action::Ack => ack().await,
        Action::AckThenReserve => {
            let next = ReserveOptions::new([QUEUE, DEBOUNCE_QUEUE], LEASE)
                .with_worker_id(worker_id.to_string());
            let (r, sent) = {
                let _g = cx.gate.read().await;
                m.settling(id, attempt, true);
                let sent = SystemTime::now();
                (cx.client.ack_then_reserve(id, attempt, next).await, sent)
            };
            match r {
                Ok(jobs) => {
                    m.acked(id, attempt);
                    let jobs = jobs.unwrap_or_default();
                    for j in &jobs {
                        m.delivered(j, sent);
                    }
                    // One job is asked for (max_jobs 1); any more would be left to expire.
                    brought = jobs.into_iter().next();
                }
                Err(e) => {
                    outcome(Err(e));
                }
            }
        }
        Action::Nack(retry) => nack(retry).await,
        Action::ExtendThenAck => {
            if extend().await {
                ack().await;
            }
        }
        Action::ExtendThenNack => {
            if extend().await {
                nack(NackRetry::Default).await;
            }
        }
        Action::Expire => {}
        Action::SlowAck => {
            tokio::time::sleep(work).await;
            ack().await;
        }
    }
    brought
}
