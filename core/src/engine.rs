//! The worker engine: reserve, lease keeping and settlement, with no callbacks into user code.
//!
//! The Rust [`Worker`](crate::worker::Worker) and the Python and Node workers all sit on this
//! engine. A host asks for the next job ([`Engine::next`]), runs its handler however it likes
//! (a tokio task, an asyncio task, a Promise), and reports the result
//! ([`Engine::complete`]). The engine owns everything that must not be written three times:
//!
//! - a poller that reserves in batches sized to the free slots (`max_in_flight` minus the jobs
//!   held), long-polls, and backs off exponentially (up to `max_backoff`) while the server is
//!   unreachable, so it never spins;
//! - lease keeping: with `auto_extend`, each held job's lease is extended when a third of it
//!   is left; if the lease is lost anyway (expired, redelivered), the job's [`Lease::lost`]
//!   resolves so the host can cancel its handler;
//! - settlement: [`Outcome`] → ack, or nack with the default policy, a delay, or dead-letter;
//! - shutdown: [`Engine::shutdown`] stops reserving (a waiting reserve is cancelled, which
//!   leases nothing), jobs reserved but not yet handed out are released at once, and
//!   [`Engine::abandon_all`] nacks whatever is still held after the host's grace period.

use crate::client::SeppClient;
use crate::error::{ErrorCode, LeaseError};
use crate::job::Job;
use crate::request::{NackRetry, ReserveOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How an engine reserves and keeps leases.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Queues to reserve from, in priority order.
    pub queues: Vec<String>,
    /// Lease requested per job (the server may clamp it). Default 30 s.
    pub lease_duration: Duration,
    /// Most jobs held at once. Default 10.
    pub max_in_flight: usize,
    /// Extend leases automatically while jobs are held. Default true.
    pub auto_extend: bool,
    /// Long-poll wait per Reserve. Default 5 s.
    pub wait_timeout: Duration,
    /// Longest pause between reserve attempts while the server fails. Default 5 s.
    pub max_backoff: Duration,
    /// Label sent with each Reserve (shown by job inspection).
    pub worker_id: Option<String>,
}

impl EngineOptions {
    /// Options for `queues` with the defaults.
    pub fn new<I, S>(queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EngineOptions {
            queues: queues.into_iter().map(Into::into).collect(),
            lease_duration: Duration::from_secs(30),
            max_in_flight: 10,
            auto_extend: true,
            wait_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            worker_id: None,
        }
    }
}

/// What became of a job, as the host reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: ack.
    Success,
    /// Failed: retry per the queue's policy (dead-lettered on the last attempt).
    Retry {
        /// Why, kept as the job's last reason.
        reason: Option<String>,
    },
    /// Failed: retry after `delay` (dead-lettered on the last attempt).
    RetryAfter {
        /// How long to wait.
        delay: Duration,
        /// Why.
        reason: Option<String>,
    },
    /// Failed for good: dead-letter now.
    Permanent {
        /// Why.
        reason: Option<String>,
    },
}

impl Outcome {
    fn nack(self) -> Option<(NackRetry, Option<String>)> {
        match self {
            Outcome::Success => None,
            Outcome::Retry { reason } => Some((NackRetry::Default, reason)),
            Outcome::RetryAfter { delay, reason } => Some((NackRetry::Delay(delay), reason)),
            Outcome::Permanent { reason } => Some((NackRetry::DeadLetter, reason)),
        }
    }
}

/// A job handed to the host, with its lease.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The job.
    pub job: Job,
    /// Fires when the lease is known to be lost.
    lost: CancellationToken,
    /// Fires when the engine lets go of the job (completed, abandoned or released).
    released: CancellationToken,
    /// The current lease expiry, moved by auto-extension.
    expires: watch::Receiver<Option<SystemTime>>,
}

impl Lease {
    /// Resolves when the lease is known to be lost (an extension found the job gone or under
    /// another attempt, or it expired while extensions failed). The host should stop the
    /// handler: the job is someone else's now.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Resolves once the job's lease is over for this worker: `true` if it was lost, `false` if
    /// the job was completed, abandoned or released. Lets a host stop waiting on [`Lease::lost`].
    pub async fn ended(&self) -> bool {
        tokio::select! {
            biased;
            _ = self.lost.cancelled() => true,
            _ = self.released.cancelled() => self.lost.is_cancelled(),
        }
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The lease's current expiry.
    pub fn expires_at(&self) -> Option<SystemTime> {
        *self.expires.borrow()
    }
}

struct Held {
    /// Stops the extender; dropped with the entry.
    stop: CancellationToken,
    /// The slot this job occupies; released when the entry is removed.
    _permit: OwnedSemaphorePermit,
}

struct Inner {
    client: SeppClient,
    opts: EngineOptions,
    slots: Arc<Semaphore>,
    /// Keyed by (job id, attempt): after a lost lease the same job can come back to this
    /// engine under a new attempt while the old delivery's handler still runs.
    held: Mutex<HashMap<(String, u32), Held>>,
    /// Leases reserved but not yet taken by the host.
    ready: tokio::sync::Mutex<mpsc::UnboundedReceiver<Lease>>,
    /// Stops the poller.
    stopping: CancellationToken,
    /// Signalled whenever a held job is settled, for `wait_idle`.
    settled: tokio::sync::Notify,
    /// The runtime the engine was started on: [`Engine::shutdown`] may be called from a
    /// thread outside it (a binding's host thread).
    runtime: tokio::runtime::Handle,
}

/// The engine; cheap to clone (clones share it). When the last clone is dropped the engine
/// shuts down: the poller stops and held leases are no longer extended (they run out and the
/// jobs are redelivered).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    /// Shared by the clones; its drop (with the last clone) stops the engine. The poller and
    /// the extenders hold `inner`, not this, so they do not keep the engine alive.
    _alive: Arc<StopOnDrop>,
}

struct StopOnDrop(Arc<Inner>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stopping.cancel();
        let held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
        for h in held.values() {
            h.stop.cancel();
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("queues", &self.inner.opts.queues)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts an engine: its poller begins reserving at once. Must be called inside a tokio
    /// runtime; the other methods may be called from anywhere.
    ///
    /// # Errors
    /// [`LeaseError::Invalid`] for no queues, a zero lease or `max_in_flight = 0`.
    pub fn start(client: SeppClient, opts: EngineOptions) -> Result<Self, LeaseError> {
        if opts.queues.is_empty() {
            return Err(LeaseError::Invalid(
                "queues is empty: list at least one queue".into(),
            ));
        }
        if opts.lease_duration.is_zero() {
            return Err(LeaseError::Invalid(
                "lease_duration is 0: it must be positive".into(),
            ));
        }
        if opts.max_in_flight == 0 {
            return Err(LeaseError::Invalid(
                "max_in_flight is 0: it must be at least 1".into(),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            client,
            slots: Arc::new(Semaphore::new(opts.max_in_flight)),
            opts,
            held: Mutex::new(HashMap::new()),
            ready: tokio::sync::Mutex::new(rx),
            stopping: CancellationToken::new(),
            settled: tokio::sync::Notify::new(),
            runtime: tokio::runtime::Handle::current(),
        });
        tokio::spawn(poll(inner.clone(), tx));
        Ok(Engine {
            _alive: Arc::new(StopOnDrop(inner.clone())),
            inner,
        })
    }

    /// The next job to process; waits until one is reserved. `None` once the engine is shut
    /// down.
    pub async fn next(&self) -> Option<Lease> {
        let mut rx = self.inner.ready.lock().await;
        tokio::select! {
            lease = rx.recv() => lease,
            _ = self.inner.stopping.cancelled() => None,
        }
    }

    /// Settles a job handed out by [`Engine::next`] and frees its slot.
    ///
    /// # Errors
    /// [`LeaseError::NotInFlight`] / [`LeaseError::AttemptMismatch`] when the lease was lost
    /// (the job will be, or was, delivered again); [`LeaseError::Client`] when the call failed
    /// (the lease then runs out and the job is redelivered).
    pub async fn complete(
        &self,
        job_id: &str,
        attempt: u32,
        outcome: Outcome,
    ) -> Result<(), LeaseError> {
        let held = self.release(job_id, attempt);
        let result = settle(&self.inner.client, job_id, attempt, outcome).await;
        drop(held);
        self.inner.settled.notify_waiters();
        result
    }

    fn release(&self, job_id: &str, attempt: u32) -> Option<Held> {
        let held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(job_id.to_string(), attempt));
        if let Some(h) = &held {
            h.stop.cancel();
        }
        held
    }

    /// Stops reserving. Jobs already handed out stay held until completed or abandoned; jobs
    /// reserved but not handed out yet are given back at once (nacked without delay).
    pub fn shutdown(&self) {
        if self.inner.stopping.is_cancelled() {
            return;
        }
        self.inner.stopping.cancel();
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            let mut rx = inner.ready.lock().await;
            while let Ok(lease) = rx.try_recv() {
                release_unstarted(&inner, lease).await;
            }
        });
    }

    /// Whether [`Engine::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.stopping.is_cancelled()
    }

    /// Jobs held (handed out or waiting to be), not yet settled.
    pub fn in_flight(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Waits until no job is held, or `timeout` passes. Returns whether it got idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.settled.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }

    /// Nacks every job still held, with the queue's retry policy and `reason`. Returns how
    /// many were nacked. Used at the end of a shutdown grace period.
    pub async fn abandon_all(&self, reason: &str) -> usize {
        let ids: Vec<(String, u32)> = {
            let held = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
            held.keys().cloned().collect()
        };
        let n = ids.len();
        for (id, attempt) in ids {
            let _ = self
                .complete(
                    &id,
                    attempt,
                    Outcome::Retry {
                        reason: Some(reason.to_string()),
                    },
                )
                .await;
        }
        n
    }
}

async fn settle(
    client: &SeppClient,
    job_id: &str,
    attempt: u32,
    outcome: Outcome,
) -> Result<(), LeaseError> {
    match outcome.nack() {
        None => client.ack(job_id, attempt).await,
        Some((retry, reason)) => client
            .nack(job_id, attempt, retry, reason)
            .await
            .map(|_| ()),
    }
}

/// The poller: reserve for the free slots, hand the jobs out, back off on errors.
async fn poll(inner: Arc<Inner>, tx: mpsc::UnboundedSender<Lease>) {
    let mut backoff = Duration::ZERO;
    loop {
        // Wait for at least one free slot, then take every free one.
        let first = tokio::select! {
            p = inner.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = inner.stopping.cancelled() => return,
        };
        let mut permits = vec![first];
        while let Ok(p) = inner.slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let mut opts = ReserveOptions::new(inner.opts.queues.clone(), inner.opts.lease_duration)
            .with_wait_timeout(inner.opts.wait_timeout)
            .with_max_jobs(permits.len() as u32);
        opts.worker_id.clone_from(&inner.opts.worker_id);
        // Cancelling a waiting reserve (by dropping it) leases nothing on the server.
        let result = tokio::select! {
            r = inner.client.reserve(opts) => r,
            _ = inner.stopping.cancelled() => return,
        };
        match result {
            Ok(jobs) => {
                backoff = Duration::ZERO;
                for job in jobs {
                    let Some(permit) = permits.pop() else { break };
                    let lease = hold(&inner, job, permit);
                    if inner.stopping.is_cancelled() || tx.send(lease.clone()).is_err() {
                        release_unstarted(&inner, lease).await;
                    }
                }
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(100), inner.opts.max_backoff);
                if e.code() == ErrorCode::Transport {
                    tracing::debug!(error = %e, ?backoff, "reserve failed; backing off");
                } else {
                    tracing::warn!(error = %e, ?backoff, "reserve failed; backing off");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = inner.stopping.cancelled() => return,
                }
            }
        }
        // Unused permits go back here (dropped).
    }
}

/// Registers a reserved job as held and starts its extender.
fn hold(inner: &Arc<Inner>, job: Job, permit: OwnedSemaphorePermit) -> Lease {
    let lost = CancellationToken::new();
    let stop = CancellationToken::new();
    let (expires_tx, expires_rx) = watch::channel(job.lease_expires_at);
    inner.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
        (job.id.clone(), job.attempt),
        Held {
            stop: stop.clone(),
            _permit: permit,
        },
    );
    if inner.opts.auto_extend {
        tokio::spawn(extend_loop(
            inner.client.clone(),
            job.id.clone(),
            job.attempt,
            inner.opts.lease_duration,
            expires_tx,
            lost.clone(),
            stop.clone(),
        ));
    } else {
        // Nobody extends it: the lease is lost when it runs out, unless released first.
        let expiry = job
            .lease_expires_at
            .unwrap_or_else(|| SystemTime::now() + inner.opts.lease_duration);
        let (lost, stop) = (lost.clone(), stop.clone());
        tokio::spawn(async move {
            let wait = expiry.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(wait) => lost.cancel(),
                _ = stop.cancelled() => {}
            }
        });
    }
    Lease {
        job,
        lost,
        released: stop,
        expires: expires_rx,
    }
}

/// A job reserved during shutdown, never handed out: give it back at once.
async fn release_unstarted(inner: &Arc<Inner>, lease: Lease) {
    let held = inner
        .held
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(lease.job.id.clone(), lease.job.attempt));
    if let Some(h) = &held {
        h.stop.cancel();
    }
    let _ = inner
        .client
        .nack(
            &lease.job.id,
            lease.job.attempt,
            NackRetry::Delay(Duration::ZERO),
            Some("worker shutting down before the job started".into()),
        )
        .await;
    drop(held);
    inner.settled.notify_waiters();
}

/// Keeps one lease alive: extends it when a third of it is left, until stopped or lost.
async fn extend_loop(
    client: SeppClient,
    job_id: String,
    attempt: u32,
    lease: Duration,
    expires: watch::Sender<Option<SystemTime>>,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let mut expiry = expires
        .borrow()
        .unwrap_or_else(|| SystemTime::now() + lease);
    // The lease actually granted (the server may clamp the one asked for).
    let mut granted = expiry
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .min(lease);
    loop {
        let remaining = expiry.duration_since(SystemTime::now()).unwrap_or_default();
        let wait = remaining
            .saturating_sub(granted / 3)
            .max(Duration::from_millis(50));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        match client.extend(&job_id, attempt, lease).await {
            Ok(new_expiry) => {
                granted = new_expiry
                    .duration_since(SystemTime::now())
                    .unwrap_or_default()
                    .max(Duration::from_millis(150));
                expiry = new_expiry;
                let _ = expires.send(Some(new_expiry));
            }
            Err(e) if e.is_lease_lost() => {
                tracing::warn!(job_id, attempt, error = %e, "lease lost");
                lost.cancel();
                return;
            }
            Err(e) => {
                if SystemTime::now() >= expiry {
                    tracing::warn!(job_id, attempt, error = %e, "lease expired while extensions failed");
                    lost.cancel();
                    return;
                }
                // Try again soon, well before the lease runs out.
                tokio::select! {
                    _ = tokio::time::sleep((granted / 10).max(Duration::from_millis(20))) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }
}
