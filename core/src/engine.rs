//! The worker engine: reserve, lease keeping, settlement and the whole worker policy, with no
//! callbacks into user code.
//!
//! The Rust [`Worker`](crate::worker::Worker) and the Python and Node workers all sit on this
//! engine, and do nothing else than run handlers: a host asks for the next job
//! ([`Engine::next`]), runs its handler however it likes (a tokio task, an asyncio task, a
//! Promise), stops it when the job's [`Lease::done`] resolves first, and reports what the
//! handler did as an [`Outcome`] ([`Engine::settle`]). Every rule of a worker is here, once:
//!
//! - reserving: a poller reserves in batches sized to the free slots (`max_in_flight` minus
//!   the jobs held), long-polls, and backs off exponentially (up to `max_backoff`) while the
//!   server is unreachable, so it never spins; a reserve the server refuses for good (no or a
//!   wrong API key, a key without the `worker` role, a queue strict mode does not know) stops
//!   the engine instead, and [`Engine::failure`] says why, so that a worker fails at once
//!   rather than wait for jobs forever;
//! - which jobs a host gets: with [`EngineOptions::job_types`] set, a job of another type is
//!   nacked at once with the queue's retry policy and the reason `no handler for job type
//!   "T"`, and never handed out;
//! - lease keeping: with `auto_extend`, each held job's lease is extended when a third of it is
//!   left. A lease that is lost anyway (an extension finds the job gone or under another
//!   attempt, or the lease ran out while extensions failed or were off) frees its slot at once
//!   with **no network call**: settling would fail, and a nack would spend an attempt, so the
//!   server's lease expiry decides (redelivery, or `LEASE_EXPIRED` on the last attempt). The
//!   job's [`Lease::done`] resolves with [`LeaseEnd::Lost`], so the host stops the handler;
//! - settlement: [`Outcome`] → ack, or nack with the queue's policy, a delay, or
//!   dead-letter; a reason longer than the server's `max_reason_bytes` is cut to it by the
//!   client;
//! - a handler time limit: with [`EngineOptions::handler_timeout`], a job handed out longer
//!   than that is nacked with the queue's retry policy and a reason saying so, and its
//!   [`Lease::done`] resolves with [`LeaseEnd::TimedOut`];
//! - reserving: the poller long-polls (waits up to `wait_timeout`) only after a reserve came
//!   back empty; after one that brought jobs, the next does not wait;
//! - shutdown: [`Engine::shutdown`] stops reserving (a waiting reserve is cancelled: the
//!   server drops it once it reads the cancel, leasing nothing; one that does not wait is let
//!   finish, for at most a lease) and jobs reserved but not yet handed out are given back at
//!   once. An abandon after shutdown first waits for the poller to have dropped its reserve,
//!   so the cancel is on its way before the nacks; the transport still sends it from a task of
//!   its own, so rarely (in 2,000 shutdowns that each abandoned a job at once while a reserve
//!   waited: 6 with the wait, 28 without, at `sync_all`; 0 of 4,000 once the poller long-polls
//!   only after an empty reserve) an abandoned job is leased into the dropped reply and comes
//!   back when that lease expires;
//!   [`Engine::drain`] then gives the held jobs `shutdown_timeout` to be settled and nacks the
//!   rest ([`LeaseEnd::Abandoned`]). An engine dropped with jobs held does the same at once;
//! - the counts of a run ([`WorkerReport`]).

use crate::client::SeppClient;
use crate::error::{ClientError, ErrorCode, LeaseError, ReserveError};
use crate::job::Job;
use crate::request::{NackRetry, ReserveOptions};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The reason a job is nacked with when a worker stops before its handler finished (the end
/// of the shutdown grace period, or an engine dropped while holding it).
pub const SHUTDOWN_REASON: &str = "worker shut down before the job finished";

/// Most jobs the poller asks for in one reserve (however many slots are free); a server
/// leases at most its `max_reserve_batch` (256 by default) anyway.
const MAX_JOBS_PER_RESERVE: usize = 1_000;

/// The reason a job reserved during shutdown, never handed out, is given back with.
const UNSTARTED_REASON: &str = "worker shutting down before the job started";

/// How an engine reserves, keeps leases and treats the jobs it holds.
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
    /// The job types the host has a handler for; a job of another type is nacked with the
    /// queue's retry policy (reason `no handler for job type "T"`) instead of being handed
    /// out. `None` (the default): every type is handed out (the host has a catch-all).
    pub job_types: Option<Vec<String>>,
    /// Longest a job may stay handed out before its handler counts as failed: the engine
    /// nacks it with the queue's retry policy and the reason `the handler ran past
    /// handler_timeout (N ms)`, and its [`Lease::done`] resolves with
    /// [`LeaseEnd::TimedOut`] so the host cancels the handler where the language allows.
    /// `None` (the default): no limit.
    pub handler_timeout: Option<Duration>,
    /// How long [`Engine::drain`] waits for the held jobs to be settled before it nacks the
    /// rest. Default 30 s.
    pub shutdown_timeout: Duration,
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
            job_types: None,
            handler_timeout: None,
            shutdown_timeout: Duration::from_secs(30),
        }
    }

    /// Checks what an engine needs of its options: what its reserves need (at least one
    /// queue, no empty queue name, a positive lease: the rule of every reserve),
    /// `max_in_flight` at least 1 and a `handler_timeout` of at least 1 ms when set. [`Engine::start`]
    /// checks them; a worker checks them when it is made, so that a mistake shows where it
    /// was written, not at `run`.
    ///
    /// # Errors
    /// [`LeaseError::Invalid`] naming the first option that is wrong.
    pub fn check(&self) -> Result<(), LeaseError> {
        ReserveOptions::new(self.queues.iter().cloned(), self.lease_duration)
            .validate()
            .map_err(LeaseError::Invalid)?;
        if self.max_in_flight == 0 {
            return Err(LeaseError::Invalid(
                "max_in_flight is 0: it must be at least 1".into(),
            ));
        }
        match self.handler_timeout {
            Some(Duration::ZERO) => {
                return Err(LeaseError::Invalid(
                    "handler_timeout is 0: it must be positive (or unset for no limit)".into(),
                ));
            }
            Some(t) if t < Duration::from_millis(1) => {
                return Err(LeaseError::Invalid(format!(
                    "handler_timeout is {t:?}: it must be at least 1 ms (or unset for no limit)"
                )));
            }
            _ => {}
        }
        Ok(())
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
    /// The nack this outcome asks for; `None` for an ack.
    fn nack(self) -> Option<(NackRetry, Option<String>)> {
        match self {
            Outcome::Success => None,
            Outcome::Retry { reason } => Some((NackRetry::Default, reason)),
            Outcome::RetryAfter { delay, reason } => Some((NackRetry::Delay(delay), reason)),
            Outcome::Permanent { reason } => Some((NackRetry::DeadLetter, reason)),
        }
    }
}

/// Why the engine let go of a job handed out to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseEnd {
    /// The host settled it ([`Engine::settle`]).
    Settled,
    /// The lease was lost; the slot was freed without a network call and the server's lease
    /// expiry decides what becomes of the job.
    Lost,
    /// The handler ran past `handler_timeout`; the engine nacked the job.
    TimedOut,
    /// The worker shut down (or the engine was dropped) before the job was settled; the
    /// engine nacked it with the queue's retry policy.
    Abandoned,
}

impl LeaseEnd {
    /// A stable lowercase name: `settled`, `lost`, `timed_out`, `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEnd::Settled => "settled",
            LeaseEnd::Lost => "lost",
            LeaseEnd::TimedOut => "timed_out",
            LeaseEnd::Abandoned => "abandoned",
        }
    }
}

impl fmt::Display for LeaseEnd {
    /// Why a running handler is stopped, for the host to pass on (the `AbortSignal` reason
    /// of a JavaScript handler).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaseEnd::Settled => "the job was settled",
            LeaseEnd::Lost => "the lease was lost: the job will be delivered again",
            LeaseEnd::TimedOut => "the handler ran past handler_timeout: the job was nacked",
            LeaseEnd::Abandoned => SHUTDOWN_REASON,
        })
    }
}

/// What a worker run did: counts of jobs, kept by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Jobs acked.
    pub acked: u64,
    /// Jobs nacked (retry, delay or dead-letter): failed handlers, job types without a
    /// handler and handlers past `handler_timeout` included.
    pub nacked: u64,
    /// Jobs whose lease was lost while held (or was found lost when settling), and jobs whose
    /// ack or nack failed (the server could not be reached): their leases run out and they are
    /// delivered again.
    pub lease_lost: u64,
    /// Jobs nacked because the worker shut down before they were settled, or given back
    /// because they were reserved during shutdown.
    pub abandoned: u64,
}

impl WorkerReport {
    /// Jobs acked.
    #[deprecated(note = "renamed `acked`")]
    pub fn succeeded(&self) -> u64 {
        self.acked
    }

    /// Jobs nacked.
    #[deprecated(note = "renamed `nacked`")]
    pub fn failed(&self) -> u64 {
        self.nacked
    }
}

/// A job handed to the host, with its lease.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The job.
    pub job: Job,
    /// Set once, when the engine lets go of the job.
    end: watch::Receiver<Option<LeaseEnd>>,
    /// The current lease expiry, moved by auto-extension.
    expires: watch::Receiver<Option<SystemTime>>,
}

impl Lease {
    /// Resolves once the engine has let go of the job, with why. Before the host settles it,
    /// anything but [`LeaseEnd::Settled`] means: stop the handler, the engine has done what
    /// the job needs (nothing for a lost lease, a nack for a timeout or a shutdown).
    pub async fn done(&self) -> LeaseEnd {
        let mut end = self.end.clone();
        match end.wait_for(Option::is_some).await {
            Ok(v) => (*v).unwrap_or(LeaseEnd::Abandoned),
            // The engine is gone; it gave the job back when it went.
            Err(_) => LeaseEnd::Abandoned,
        }
    }

    /// Resolves when the lease is known to be lost (never, if it is not). The host should
    /// stop the handler: the job is someone else's now.
    pub async fn lost(&self) {
        if self.done().await != LeaseEnd::Lost {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the engine has let go of the job: `true` if its lease was lost, `false`
    /// if it was settled, timed out or abandoned. Lets a host stop waiting on
    /// [`Lease::lost`].
    pub async fn ended(&self) -> bool {
        self.done().await == LeaseEnd::Lost
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        *self.end.borrow() == Some(LeaseEnd::Lost)
    }

    /// The lease's current expiry.
    pub fn expires_at(&self) -> Option<SystemTime> {
        *self.expires.borrow()
    }
}

/// A job the engine holds: from its reservation until it is settled, lost, timed out or
/// abandoned.
struct Held {
    /// Stops the job's extender and timers; cancelled when the entry is removed.
    stop: CancellationToken,
    /// Tells the host's [`Lease`] why the engine let go; sent when the entry is removed.
    end: watch::Sender<Option<LeaseEnd>>,
    /// The slot this job occupies; released when the entry is dropped (after any network
    /// call that settles it), or handed to the next job an ack brought.
    permit: OwnedSemaphorePermit,
    /// The lease's current expiry (moved by the extender).
    expires: watch::Receiver<Option<SystemTime>>,
    /// Handed to the host by [`Engine::next`]: its handler runs (or is about to). A job
    /// reserved but still waiting to be handed out is given back at a stop, not waited for.
    started: bool,
}

type Key = (String, u32);

struct Inner {
    client: SeppClient,
    opts: EngineOptions,
    slots: Arc<Semaphore>,
    /// Keyed by (job id, attempt): after a lost lease the same job can come back to this
    /// engine under a new attempt while the old delivery's handler still runs.
    held: Mutex<HashMap<Key, Held>>,
    /// Leases reserved but not yet taken by the host.
    ready: tokio::sync::Mutex<mpsc::UnboundedReceiver<Lease>>,
    /// Where the poller and acks that bring a next job put its lease.
    to_host: mpsc::UnboundedSender<Lease>,
    /// Stops the poller.
    stopping: CancellationToken,
    /// Cancelled once the poller has returned (and so dropped its reserve, if one waited).
    poller_gone: CancellationToken,
    /// Ends a drain's grace period at once ([`Engine::end_grace_period`]).
    hurry: CancellationToken,
    /// Signalled whenever a held job is let go, for `wait_idle`.
    settled: tokio::sync::Notify,
    /// The counts of the run.
    report: Mutex<WorkerReport>,
    /// Why the engine stopped by itself: a reserve the server refused for good.
    failure: Mutex<Option<ClientError>>,
    /// The runtime the engine was started on: [`Engine::shutdown`] may be called from a
    /// thread outside it (a binding's host thread).
    runtime: tokio::runtime::Handle,
}

impl Inner {
    /// Removes the job from the held set, counts it (`count`) and then tells its lease why;
    /// `None` when it was not held (settled, lost, timed out or abandoned already). The count
    /// comes first: a host that stops the worker as soon as the lease's end reaches it gets a
    /// report that includes the job. The returned entry keeps the slot until it is dropped.
    fn let_go(
        &self,
        key: &Key,
        end: LeaseEnd,
        count: impl FnOnce(&mut WorkerReport),
    ) -> Option<Held> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)?;
        self.count(count);
        held.stop.cancel();
        held.end.send_replace(Some(end));
        Some(held)
    }

    /// The lease of `key` is lost: free its slot, with no network call.
    fn lose(&self, key: &Key) {
        if self
            .let_go(key, LeaseEnd::Lost, |r| r.lease_lost += 1)
            .is_some()
        {
            self.settled.notify_waiters();
        }
    }

    fn count(&self, f: impl FnOnce(&mut WorkerReport)) {
        f(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Nacks a job the engine let go of itself (not handed out, timed out, abandoned),
    /// then frees its slot. The result only matters to the logs: if the nack fails, the lease
    /// runs out and the job is redelivered. The call ends with the job's lease at the latest
    /// (the server refuses a nack after it, and the job comes back then anyway), so that a stop
    /// does not wait out the client's retries against a server that does not answer.
    async fn nack_held(&self, key: &Key, held: Held, retry: NackRetry, reason: &str) {
        let (job_id, attempt) = key;
        let expiry = *held.expires.borrow();
        let left = expiry.map(|e| e.duration_since(SystemTime::now()).unwrap_or_default());
        let nack = self
            .client
            .nack(job_id, *attempt, retry, Some(reason.to_string()));
        let result = match left {
            Some(left) => tokio::time::timeout(left, nack).await.unwrap_or_else(|_| {
                Err(LeaseError::Client(crate::error::ClientError::new(
                    ErrorCode::Transport,
                    "the lease ran out before the nack was answered",
                )))
            }),
            None => nack.await,
        };
        if let Err(e) = result {
            tracing::warn!(job_id, attempt, error = %e, reason, "could not nack the job; its lease will run out");
        }
        drop(held);
        self.settled.notify_waiters();
    }
}

/// The engine; cheap to clone (clones share it). When the last clone is dropped the engine
/// stops: the poller stops and the jobs still held are nacked at once (as at the end of a
/// shutdown grace period), so no job stays leased by an engine nobody can reach.
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
        let keys: Vec<Key> = {
            let held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
            held.keys().cloned().collect()
        };
        if keys.is_empty() {
            return;
        }
        // On the engine's runtime: a spawn after it shut down (process exit) is dropped.
        let inner = self.0.clone();
        self.0.runtime.spawn(async move {
            abandon(&inner, keys, SHUTDOWN_REASON).await;
        });
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
    /// [`LeaseError::Invalid`] for what [`EngineOptions::check`] refuses.
    pub fn start(client: SeppClient, opts: EngineOptions) -> Result<Self, LeaseError> {
        opts.check()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            client,
            slots: Arc::new(Semaphore::new(opts.max_in_flight)),
            opts,
            held: Mutex::new(HashMap::new()),
            ready: tokio::sync::Mutex::new(rx),
            to_host: tx,
            stopping: CancellationToken::new(),
            poller_gone: CancellationToken::new(),
            hurry: CancellationToken::new(),
            settled: tokio::sync::Notify::new(),
            report: Mutex::new(WorkerReport::default()),
            failure: Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
        });
        tokio::spawn(poll(inner.clone()));
        Ok(Engine {
            _alive: Arc::new(StopOnDrop(inner.clone())),
            inner,
        })
    }

    /// The next job to process; waits until one is reserved. `None` once the engine is shut
    /// down. With `handler_timeout`, the job's time starts now.
    pub async fn next(&self) -> Option<Lease> {
        let mut rx = self.inner.ready.lock().await;
        loop {
            let lease = tokio::select! {
                lease = rx.recv() => lease?,
                _ = self.inner.stopping.cancelled() => return None,
            };
            // Lost while it waited here: its slot is free already.
            if lease.end.borrow().is_some() {
                continue;
            }
            let key = (lease.job.id.clone(), lease.job.attempt);
            if let Some(h) = self
                .inner
                .held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&key)
            {
                h.started = true;
            }
            if let Some(limit) = self.inner.opts.handler_timeout {
                start_timer(&self.inner, &lease, limit);
            }
            return Some(lease);
        }
    }

    /// Settles a job handed out by [`Engine::next`] as `outcome` says (ack, or nack with the
    /// queue's policy, a delay, or dead-letter) and frees its slot.
    ///
    /// # Errors
    /// [`LeaseError::NotInFlight`] when the engine no longer holds the job (its lease was
    /// lost, it timed out or was abandoned, or it was settled already: nothing is sent), or
    /// when the server says the lease is lost ([`LeaseError::AttemptMismatch`] too);
    /// [`LeaseError::Client`] when the call failed (the lease then runs out and the job is
    /// redelivered). The run's counts include the job either way.
    ///
    /// The engine lets go of the job when this is called (it no longer counts in
    /// [`Engine::in_flight`]); the returned future makes the call. Dropped unpolled, the job
    /// is not settled and its lease runs out.
    pub fn settle(
        &self,
        job_id: &str,
        attempt: u32,
        outcome: Outcome,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send + use<> {
        // The engine lets go of the job now, when settle is called, not when the returned
        // future is first polled: a binding awaits it on another thread a moment later, and a
        // stop that begins in between must not count the job as still running
        // ([`Engine::stop_notice`]).
        let key = (job_id.to_string(), attempt);
        let held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        // Its lease keeping stops now too: should the future be dropped unpolled, the job is
        // neither settled nor extended, and its lease runs out as after a failed call.
        if let Some(h) = &held {
            h.stop.cancel();
        }
        let inner = self.inner.clone();
        async move {
            let (job_id, attempt) = (key.0.as_str(), key.1);
            let inner = &inner;
            let Some(held) = held else {
                return Err(LeaseError::NotInFlight {
                    job_id: job_id.to_string(),
                    message: format!(
                        "this worker no longer holds job {job_id} (attempt {attempt}): it was \
                         settled already, or its lease was lost, timed out or abandoned"
                    ),
                });
            };
            let acked = outcome == Outcome::Success;
            let result = match outcome.nack() {
                // The ack brings the job that takes this one's slot (one call and one commit
                // instead of an ack and a Reserve); a server without that answers none, and the
                // freed slot goes back to the poller.
                None if !inner.stopping.is_cancelled() => {
                    let mut next =
                        ReserveOptions::new(inner.opts.queues.clone(), inner.opts.lease_duration);
                    next.worker_id.clone_from(&inner.opts.worker_id);
                    inner.client.ack_then_reserve(job_id, attempt, next).await
                }
                None => inner.client.ack(job_id, attempt).await.map(|()| None),
                Some((retry, reason)) => inner
                    .client
                    .nack(job_id, attempt, retry, reason)
                    .await
                    .map(|_| None),
            };
            match &result {
                Err(_) => inner.count(|r| r.lease_lost += 1),
                Ok(_) if acked => inner.count(|r| r.acked += 1),
                Ok(_) => inner.count(|r| r.nacked += 1),
            }
            if let Err(e) = &result
                && !e.is_lease_lost()
            {
                tracing::warn!(job_id, attempt, error = %e, "could not settle the job; its lease will run out");
            }
            held.end.send_replace(Some(LeaseEnd::Settled));
            let Held { permit, .. } = held;
            let next = match &result {
                Ok(Some(jobs)) => jobs.clone(),
                _ => Vec::new(),
            };
            let mut permit = Some(permit);
            for job in next {
                // One job is asked for; a slot is taken for any more, or the job is given back.
                let slot = permit
                    .take()
                    .or_else(|| inner.slots.clone().try_acquire_owned().ok());
                match slot {
                    Some(slot) => hand_out(inner, job, slot).await,
                    None => {
                        let (id, attempt) = (job.id, job.attempt);
                        let _ = inner
                            .client
                            .nack(
                                &id,
                                attempt,
                                NackRetry::Delay(Duration::ZERO),
                                Some(UNSTARTED_REASON.into()),
                            )
                            .await;
                    }
                }
            }
            drop(permit);
            inner.settled.notify_waiters();
            result.map(|_| ())
        }
    }

    /// The former name of [`Engine::settle`].
    ///
    /// # Errors
    /// As [`Engine::settle`].
    #[deprecated(note = "renamed `settle`")]
    pub async fn complete(
        &self,
        job_id: &str,
        attempt: u32,
        outcome: Outcome,
    ) -> Result<(), LeaseError> {
        self.settle(job_id, attempt, outcome).await
    }

    /// Stops reserving. Jobs already handed out stay held until settled or abandoned; jobs
    /// reserved but not handed out yet are given back at once (nacked without delay).
    pub fn shutdown(&self) {
        shut_down(&self.inner);
    }

    /// Why the engine stopped by itself, if it did: the server refused a reserve with an error
    /// that no retry can mend: [`ErrorCode::Unauthenticated`],
    /// [`ErrorCode::PermissionDenied`], [`ErrorCode::InvalidArgument`],
    /// [`ErrorCode::FailedPrecondition`] (strict mode, an undeclared queue),
    /// [`ErrorCode::Unsupported`] or [`ErrorCode::InvalidConfig`]. The engine then shuts down as
    /// [`Engine::shutdown`] does, so [`Engine::next`] returns `None`; a worker drains as usual
    /// and then fails with this error. `None` while the engine runs, and after a stop its host
    /// asked for.
    #[must_use]
    pub fn failure(&self) -> Option<ClientError> {
        self.inner
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether [`Engine::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.stopping.is_cancelled()
    }

    /// What a worker tells its user as a stop begins while handlers still run: how many
    /// ([`Engine::running`]: jobs reserved but never handed out are given back, not counted),
    /// how long the stop may wait for them, and what becomes of the rest. `None` when none
    /// runs (the stop is immediate). The same words from every language's worker: Rust
    /// logs them with `tracing`, Python with `logging` (a warning), Node on standard error.
    pub fn stop_notice(&self) -> Option<String> {
        let held = self.running();
        if held == 0 {
            return None;
        }
        let (jobs, them) = if held == 1 {
            ("1 running job".to_string(), "it is")
        } else {
            (format!("{held} running jobs"), "they are")
        };
        let wait = self.inner.opts.shutdown_timeout;
        let wait = if wait.subsec_millis() == 0 {
            format!("{} s", wait.as_secs())
        } else {
            format!("{} ms", wait.as_millis())
        };
        let why = match self.failure() {
            Some(e) => format!(" (the server refused to reserve: {e})"),
            None => String::new(),
        };
        Some(format!(
            "sepp worker stopping{why}: waiting up to {wait} (shutdown_timeout) for {jobs} to \
             finish; if not done by then, {them} given back to the queue (nacked, counting the \
             attempt)"
        ))
    }

    /// Jobs handed out by [`Engine::next`] and not yet settled or let go: those whose handlers
    /// run. What [`Engine::stop_notice`] counts.
    pub fn running(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|h| h.started)
            .count()
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

    /// A graceful end: stops reserving ([`Engine::shutdown`]), waits up to `shutdown_timeout`
    /// (or until [`Engine::end_grace_period`]) for the held jobs to be settled, then nacks the
    /// rest with the queue's retry policy and the reason `worker shut down before the job
    /// finished`; their leases end with [`LeaseEnd::Abandoned`], so the host stops their
    /// handlers. Returns how many were nacked.
    pub async fn drain(&self) -> usize {
        self.shutdown();
        tokio::select! {
            _ = self.wait_idle(self.inner.opts.shutdown_timeout) => {}
            _ = self.inner.hurry.cancelled() => {}
        }
        self.abandon_all(SHUTDOWN_REASON).await
    }

    /// Ends the grace period of a [`Engine::drain`] now (or the next one's, at once): the
    /// jobs still held are nacked without waiting further. For a second stop signal, or a
    /// cancelled run.
    pub fn end_grace_period(&self) {
        self.inner.hurry.cancel();
    }

    /// Nacks every job still held, with the queue's retry policy and `reason`; their leases
    /// end with [`LeaseEnd::Abandoned`]. Returns how many were nacked.
    pub async fn abandon_all(&self, reason: &str) -> usize {
        let keys: Vec<Key> = {
            let held = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
            held.keys().cloned().collect()
        };
        abandon(&self.inner, keys, reason).await
    }

    /// The counts of the run so far.
    pub fn report(&self) -> WorkerReport {
        *self.inner.report.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Stops reserving and gives back the jobs reserved but not handed out ([`Engine::shutdown`]).
fn shut_down(inner: &Arc<Inner>) {
    if inner.stopping.is_cancelled() {
        return;
    }
    inner.stopping.cancel();
    let inner = inner.clone();
    inner.runtime.clone().spawn(async move {
        let mut rx = inner.ready.lock().await;
        while let Ok(lease) = rx.try_recv() {
            release_unstarted(&inner, lease).await;
        }
    });
}

/// Whether a reserve refused with `e` stops the engine instead of being retried: a missing or
/// wrong API key, a key without the `worker` role, a request the server calls malformed, a
/// queue that strict mode does not know, a server without the call. Retrying those only hides
/// the mistake (the worker would wait for jobs forever); an unreachable or overloaded server,
/// or one that failed (`ServerFault`), is retried with backoff.
fn stops_the_engine(e: &ClientError) -> bool {
    matches!(
        e.code(),
        ErrorCode::Unauthenticated
            | ErrorCode::PermissionDenied
            | ErrorCode::InvalidArgument
            | ErrorCode::FailedPrecondition
            | ErrorCode::Unsupported
            | ErrorCode::InvalidConfig
    )
}

/// Lets go of the held jobs among `keys` and nacks them with `reason`, all at once. Returns
/// how many it let go of (a job settled meanwhile is not counted).
async fn abandon(inner: &Arc<Inner>, keys: Vec<Key>, reason: &str) -> usize {
    if inner.stopping.is_cancelled() {
        // Let the poller drop its waiting reserve before the nacks go out: the cancel then
        // starts towards the server first, so it is read before the nacked jobs become ready
        // and the cancelled reserve cannot take them (see the module's notes on shutdown).
        inner.poller_gone.cancelled().await;
    }
    let taken: Vec<(Key, Held)> = keys
        .into_iter()
        .filter_map(|k| {
            inner
                .let_go(&k, LeaseEnd::Abandoned, |r| r.abandoned += 1)
                .map(|h| (k, h))
        })
        .collect();
    let n = taken.len();
    futures_util::future::join_all(
        taken
            .into_iter()
            .map(|(k, h)| async move { inner.nack_held(&k, h, NackRetry::Default, reason).await }),
    )
    .await;
    n
}

/// Times a handed-out job: past `limit`, it is nacked and its lease ends as timed out.
fn start_timer(inner: &Arc<Inner>, lease: &Lease, limit: Duration) {
    let key: Key = (lease.job.id.clone(), lease.job.attempt);
    let Some(stop) = inner
        .held
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .map(|h| h.stop.clone())
    else {
        return;
    };
    let inner = inner.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(limit) => {}
            _ = stop.cancelled() => return,
        }
        let Some(held) = inner.let_go(&key, LeaseEnd::TimedOut, |r| r.nacked += 1) else {
            return;
        };
        let reason = format!(
            "the handler ran past handler_timeout ({} ms)",
            limit.as_millis()
        );
        tracing::warn!(job_id = key.0, attempt = key.1, "{reason}");
        inner
            .nack_held(&key, held, NackRetry::Default, &reason)
            .await;
    });
}

/// The poller: reserve for the free slots, hand the jobs out, back off on errors.
async fn poll(inner: Arc<Inner>) {
    let _gone = inner.poller_gone.clone().drop_guard();
    let mut backoff = Duration::ZERO;
    // Whether the last reserve came back empty: only then does the next one wait (long-poll).
    // A reserve that does not wait answers at once, so a stop that comes while it is in flight
    // lets it finish and gives back what it leased; cancelling it could strand its jobs, leased
    // into a reply nobody reads, until their leases ran out.
    let mut idle = false;
    loop {
        // Wait for at least one free slot, then take every free one.
        let first = tokio::select! {
            biased;
            _ = inner.stopping.cancelled() => return,
            p = inner.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let mut permits = vec![first];
        while permits.len() < MAX_JOBS_PER_RESERVE
            && let Ok(p) = inner.slots.clone().try_acquire_owned()
        {
            permits.push(p);
        }
        let wait = if idle {
            inner.opts.wait_timeout
        } else {
            Duration::ZERO
        };
        let mut opts = ReserveOptions::new(inner.opts.queues.clone(), inner.opts.lease_duration)
            .with_wait_timeout(wait)
            .with_max_jobs(permits.len() as u32);
        opts.worker_id.clone_from(&inner.opts.worker_id);
        let reserve = inner.client.reserve(opts);
        tokio::pin!(reserve);
        let result = tokio::select! {
            r = &mut reserve => r,
            _ = inner.stopping.cancelled() => {
                if idle {
                    // Cancelling a waiting reserve (by dropping it) leases nothing on the
                    // server once it reads the cancel (see the module's notes on shutdown).
                    return;
                }
                // Its answer is on the way: its jobs are given back below. A server that does
                // not answer is given up on once any lease it took would have run out.
                match tokio::time::timeout(inner.opts.lease_duration, reserve).await {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
        };
        match result {
            Ok(jobs) => {
                backoff = Duration::ZERO;
                idle = jobs.is_empty();
                for job in jobs {
                    let Some(permit) = permits.pop() else { break };
                    hand_out(&inner, job, permit).await;
                }
            }
            Err(ReserveError::Client(e)) if stops_the_engine(&e) => {
                tracing::error!(error = %e, "the server refused to reserve; the worker stops");
                *inner.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                shut_down(&inner);
                return;
            }
            Err(e) => {
                idle = false;
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

/// Holds a leased job in `permit`'s slot and hands it to the host; one of a type this engine
/// has no handler for is nacked, and one leased while the engine stops is given back.
async fn hand_out(inner: &Arc<Inner>, job: Job, permit: OwnedSemaphorePermit) {
    let handled = inner
        .opts
        .job_types
        .as_ref()
        .is_none_or(|types| types.contains(&job.job_type));
    let lease = hold(inner, job, permit);
    if !handled {
        tokio::spawn(refuse_unhandled(inner.clone(), lease));
    } else if inner.stopping.is_cancelled() || inner.to_host.send(lease.clone()).is_err() {
        release_unstarted(inner, lease).await;
    }
}

/// Registers a reserved job as held and starts its lease keeping: the extender, or without
/// auto-extension a timer that declares the lease lost when it runs out.
fn hold(inner: &Arc<Inner>, job: Job, permit: OwnedSemaphorePermit) -> Lease {
    let stop = CancellationToken::new();
    let (end_tx, end_rx) = watch::channel(None);
    let (expires_tx, expires_rx) = watch::channel(job.lease_expires_at);
    let key: Key = (job.id.clone(), job.attempt);
    inner.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
        key.clone(),
        Held {
            stop: stop.clone(),
            end: end_tx,
            permit,
            expires: expires_rx.clone(),
            started: false,
        },
    );
    if inner.opts.auto_extend {
        tokio::spawn(extend_loop(inner.clone(), key, expires_tx, stop));
    } else {
        // Nobody extends it: the lease is lost when it runs out, unless settled first.
        let expiry = job
            .lease_expires_at
            .unwrap_or_else(|| SystemTime::now() + inner.opts.lease_duration);
        let inner = inner.clone();
        tokio::spawn(async move {
            let wait = expiry.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {
                    tracing::warn!(job_id = key.0, attempt = key.1, "lease ran out");
                    inner.lose(&key);
                }
                _ = stop.cancelled() => {}
            }
        });
    }
    Lease {
        job,
        end: end_rx,
        expires: expires_rx,
    }
}

/// A job of a type the host has no handler for: nacked with the queue's retry policy.
async fn refuse_unhandled(inner: Arc<Inner>, lease: Lease) {
    let key: Key = (lease.job.id.clone(), lease.job.attempt);
    let Some(held) = inner.let_go(&key, LeaseEnd::Settled, |r| r.nacked += 1) else {
        return;
    };
    let reason = format!("no handler for job type {:?}", lease.job.job_type);
    tracing::warn!(job_id = key.0, attempt = key.1, "{reason}");
    inner
        .nack_held(&key, held, NackRetry::Default, &reason)
        .await;
}

/// A job reserved during shutdown, never handed out: give it back at once.
async fn release_unstarted(inner: &Arc<Inner>, lease: Lease) {
    let key: Key = (lease.job.id.clone(), lease.job.attempt);
    let Some(held) = inner.let_go(&key, LeaseEnd::Abandoned, |r| r.abandoned += 1) else {
        return;
    };
    inner
        .nack_held(
            &key,
            held,
            NackRetry::Delay(Duration::ZERO),
            UNSTARTED_REASON,
        )
        .await;
}

/// Keeps one lease alive: extends it when a third of it is left, until stopped or lost.
async fn extend_loop(
    inner: Arc<Inner>,
    key: Key,
    expires: watch::Sender<Option<SystemTime>>,
    stop: CancellationToken,
) {
    let lease = inner.opts.lease_duration;
    let (job_id, attempt) = (&key.0, key.1);
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
        // The call may hang (a connection that stopped carrying packets): the lease is lost
        // when it runs out, whether or not the call has answered by then.
        let left = expiry.duration_since(SystemTime::now()).unwrap_or_default();
        let extended = tokio::select! {
            r = inner.client.extend(job_id, attempt, lease) => r,
            _ = tokio::time::sleep(left) => {
                tracing::warn!(job_id, attempt, "lease ran out while an extension was unanswered");
                inner.lose(&key);
                return;
            }
            _ = stop.cancelled() => return,
        };
        match extended {
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
                inner.lose(&key);
                return;
            }
            Err(e) => {
                if SystemTime::now() >= expiry {
                    tracing::warn!(job_id, attempt, error = %e, "lease expired while extensions failed");
                    inner.lose(&key);
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
