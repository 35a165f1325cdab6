//! What a durable job queue means: the rules of `docs/` and the spec, on domain types.
//!
//! [`Queue`] is the one entry point the gRPC edge calls. It validates and resolves requests
//! (pure functions in [`validate`], [`dedup`], [`lease`], [`backoff`], [`limits`]), and hands
//! each transition to the [`Store`] together with the rule that decides it ([`enqueue`],
//! [`lease::fence`], [`lifecycle`]): the store reads the facts, calls the rule and applies its
//! plan atomically. After a transition it wakes the Reserves waiting on queues that got ready
//! jobs ([`reserve`]) and moves the sweeper's alarm ([`sweeper`]). Time comes from one
//! [`clock::Clock`].

pub mod admin;
pub mod backoff;
pub mod clock;
pub mod dedup;
pub mod enqueue;
pub mod lease;
pub mod lifecycle;
pub mod limits;
pub mod model;
pub mod rates;
pub mod reply;
pub mod reserve;
pub mod schedule;
pub mod sweeper;
pub mod validate;

use self::clock::Clock;
use self::limits::Limits;
use self::model::{Accepted, EnqueueInput, JobOutcome, Rejection};
use self::reserve::ReadySignals;
use self::sweeper::SweepWake;
use self::validate::NameUse;
use crate::domain::{
    DeadLetter, EnqueuePlan, Finish, InsertOutcome, Job, JobFacts, JobId, LastReason, NewJob,
    Placement, ReserveSpec, Settle, SettleRefusal, UnixMs,
};
use crate::error::QueueError;
use crate::metrics::Metrics;
use crate::storage::{EnqueueFacts, SettleRule, Settled, StorageError, Store};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The most dead letters one drain returns, whatever `max` asks for.
pub const MAX_DRAIN: u32 = 1000;

/// A Reserve as received (durations in milliseconds, signed so that negatives can be refused).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReserveInput {
    /// Queues in poll order.
    pub queues: Vec<String>,
    /// How long to wait for a job; `None` means do not wait.
    pub wait_timeout_ms: Option<i64>,
    /// The requested lease; required and positive.
    pub lease_ms: Option<i64>,
    /// Optional worker label.
    pub worker_id: Option<String>,
    /// At most this many jobs; default 1.
    pub max_jobs: Option<u32>,
}

/// How to retry a nacked job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackStrategy {
    /// The queue's retry policy.
    Default,
    /// After this delay in milliseconds (clamped to the schedule horizon).
    Delay(i64),
    /// Dead-letter at once.
    DeadLetter,
}

/// The server-wide facts `GetServerInfo` reports.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// This build's version.
    pub version: &'static str,
    /// Now.
    pub server_time: UnixMs,
    /// The limits.
    pub limits: Arc<Limits>,
}

/// The job queue.
pub struct Queue {
    store: Arc<dyn Store>,
    limits: Arc<Limits>,
    /// Wake-ups of waiting Reserves; the store also feeds it ([`crate::storage::ReadyListener`]).
    signals: Arc<ReadySignals>,
    /// The sweeper's alarm, moved earlier by transitions that create earlier deadlines.
    sweep_wake: SweepWake,
    /// The time of every transition.
    clock: Arc<dyn Clock>,
    /// Cancelled at shutdown: waiting Reserves return empty.
    shutdown: CancellationToken,
    /// The process counters ([`crate::metrics`]); off unless set with [`Queue::with_metrics`].
    metrics: Arc<Metrics>,
    /// The `[[schedules]]` it enqueues ([`schedule`]); none unless set with
    /// [`Queue::with_schedules`].
    schedules: Arc<schedule::Schedules>,
    /// This server's per-minute counts not yet added to the store ([`rates`]).
    rates: rates::Rates,
}

impl Queue {
    /// A queue over `store`, whose transitions take their time from `clock`. Registers its
    /// ready signals with the store ([`Store::listen`]).
    pub fn new(
        store: Arc<dyn Store>,
        limits: Arc<Limits>,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> Self {
        let signals = Arc::new(ReadySignals::default());
        store.listen(signals.clone());
        Queue {
            store,
            limits,
            signals,
            sweep_wake: SweepWake::default(),
            clock,
            shutdown,
            metrics: Metrics::disabled(),
            schedules: Arc::default(),
            rates: rates::Rates::default(),
        }
    }

    /// Enqueues the ticks of `schedules` (when a [`schedule::Scheduler`] runs) and lists them
    /// ([`Queue::list_schedules`]).
    #[must_use]
    pub fn with_schedules(mut self, schedules: Arc<schedule::Schedules>) -> Self {
        self.schedules = schedules;
        self
    }

    /// Counts this queue's transitions in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this queue counts in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The clock every transition reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The wake-ups of waiting Reserves (tests use [`ReadySignals::waiting`] to know that a
    /// Reserve waits).
    pub fn ready_signals(&self) -> &Arc<ReadySignals> {
        &self.signals
    }

    /// The limits in force.
    pub fn limits(&self) -> &Arc<Limits> {
        &self.limits
    }

    fn check_batch_size(&self, n: usize) -> Result<(), QueueError> {
        if n == 0 {
            return Err(QueueError::InvalidArgument(
                "jobs is empty: send at least one job".into(),
            ));
        }
        if n > self.limits.max_enqueue_batch as usize {
            return Err(QueueError::InvalidArgument(format!(
                "jobs has {n} entries, max_enqueue_batch is {}",
                self.limits.max_enqueue_batch
            )));
        }
        Ok(())
    }

    /// Commits validated jobs in one store transition under the enqueue rule
    /// ([`enqueue::decide`]), then wakes waiters of the queues that got ready jobs and the
    /// sweeper for new schedules. Returns the outcomes and each job's queue.
    async fn commit(
        &self,
        jobs: Vec<NewJob>,
        atomic: bool,
        now: UnixMs,
    ) -> Result<(Vec<InsertOutcome>, Vec<(Arc<str>, Option<UnixMs>)>), QueueError> {
        let repeats = enqueue::prepass(&jobs);
        let placed: Vec<(Arc<str>, Option<UnixMs>)> = jobs
            .iter()
            .map(|j| (j.queue.clone(), j.scheduled_at))
            .collect();
        let limits = &*self.limits;
        let declared = |q: &str| limits.is_declared(q);
        let cap = enqueue::QueueCap {
            max: limits.max_queues,
            exempt: &declared,
        };
        let rule = |jobs: &[NewJob], facts: &dyn EnqueueFacts| -> EnqueuePlan {
            enqueue::decide(jobs, &repeats, facts, &cap, atomic, now)
        };
        let outcomes = self.store.enqueue(jobs, &rule, now).await?;
        let written = !(atomic && outcomes.iter().any(InsertOutcome::is_refusal));
        if written {
            // Count ready jobs per queue (a batch usually fills one queue).
            let mut ready: Vec<(&str, usize)> = Vec::new();
            // Jobs created per queue, counted once per queue into the rates.
            let mut created: Vec<(&Arc<str>, u64)> = Vec::new();
            for (o, (queue, scheduled_at)) in outcomes.iter().zip(&placed) {
                if matches!(o, InsertOutcome::Created(_)) {
                    match created.iter_mut().find(|(q, _)| *q == queue) {
                        Some((_, n)) => *n += 1,
                        None => created.push((queue, 1)),
                    }
                }
                let scheduled_at = match o {
                    InsertOutcome::Created(_) => scheduled_at,
                    // A replaced job may have moved (from scheduled to ready, or later).
                    InsertOutcome::Replaced(_, Placement::Ready) => &None,
                    InsertOutcome::Replaced(_, Placement::Scheduled { due }) => &Some(*due),
                    _ => continue,
                };
                match scheduled_at {
                    Some(due) => self.sweep_wake.deadline_at(*due),
                    None => match ready.iter_mut().find(|(q, _)| *q == &**queue) {
                        Some((_, n)) => *n += 1,
                        None => ready.push((queue, 1)),
                    },
                }
            }
            for (queue, n) in ready {
                self.signals.job_ready(queue, n);
            }
            for (queue, n) in created {
                self.rates.count(queue, rates::Event::Enqueued, n, now);
            }
        }
        Ok((outcomes, placed))
    }

    /// Enqueues each job on its own: one outcome per input, in order.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for an empty batch or one over `max_enqueue_batch`;
    /// [`QueueError::Storage`] when the write fails.
    pub async fn enqueue_batch(
        &self,
        inputs: Vec<EnqueueInput>,
    ) -> Result<Vec<JobOutcome>, QueueError> {
        self.check_batch_size(inputs.len())?;
        let now = self.clock.now();
        let mut outcomes: Vec<Option<JobOutcome>> = Vec::with_capacity(inputs.len());
        let mut valid = Vec::with_capacity(inputs.len());
        let mut slots = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.into_iter().enumerate() {
            match validate::validate_job(input, &self.limits, now) {
                Ok(job) => {
                    slots.push(i);
                    valid.push(job);
                    outcomes.push(None);
                }
                Err(r) => {
                    self.metrics.rejected(r.kind());
                    outcomes.push(Some(Err(r)));
                }
            }
        }
        if !valid.is_empty() {
            let (inserted, placed) = self.commit(valid, false, now).await?;
            for ((slot, outcome), (queue, _)) in slots.into_iter().zip(inserted).zip(placed) {
                let outcome = insert_outcome(outcome, &queue);
                self.count_enqueue(&queue, &outcome);
                outcomes[slot] = Some(outcome);
            }
        }
        Ok(outcomes.into_iter().flatten().collect())
    }

    /// Enqueues all jobs or none.
    ///
    /// Returns `Ok(Ok(acks))` in request order, or `Ok(Err(failures))` listing every failing
    /// index (validation failures, or `QueueFull` at commit) when nothing was written.
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`].
    pub async fn enqueue_atomic(
        &self,
        inputs: Vec<EnqueueInput>,
    ) -> Result<Result<Vec<Accepted>, Vec<(u32, Rejection)>>, QueueError> {
        self.check_batch_size(inputs.len())?;
        let now = self.clock.now();
        let mut valid = Vec::with_capacity(inputs.len());
        let mut failures = Vec::new();
        for (i, input) in inputs.into_iter().enumerate() {
            match validate::validate_job(input, &self.limits, now) {
                Ok(job) => valid.push(job),
                Err(r) => failures.push((i as u32, r)),
            }
        }
        if !failures.is_empty() {
            for (_, r) in &failures {
                self.metrics.rejected(r.kind());
            }
            return Ok(Err(failures));
        }
        let (inserted, placed) = self.commit(valid, true, now).await?;
        let mut acks = Vec::with_capacity(inserted.len());
        for (i, (outcome, (queue, _))) in inserted.into_iter().zip(placed.iter()).enumerate() {
            match insert_outcome(outcome, queue) {
                Ok(a) => acks.push(a),
                Err(r) => failures.push((i as u32, r)),
            }
        }
        if failures.is_empty() {
            for (a, (queue, _)) in acks.iter().zip(&placed) {
                self.metrics.enqueued(queue, a.deduplicated);
            }
            Ok(Ok(acks))
        } else {
            for (_, r) in &failures {
                self.metrics.rejected(r.kind());
            }
            Ok(Err(failures))
        }
    }

    /// Leases up to `max_jobs` ready jobs, waiting up to the (clamped) wait timeout for one.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for no queues, too many queues, a missing, zero or
    /// negative lease, a negative wait, `max_jobs = 0` or a malformed queue name;
    /// [`QueueError::UnknownQueues`] in strict mode; [`QueueError::TooManyWaitingReserves`];
    /// [`QueueError::Storage`].
    pub async fn reserve(&self, input: ReserveInput) -> Result<Vec<Job>, QueueError> {
        self.reserve_within(input, &reserve::Unbounded).await
    }

    /// [`Queue::reserve`] whose reply takes each leased job's bytes from `room` (the
    /// transport's reply buffer): what does not fit is not leased.
    ///
    /// # Errors
    /// As [`Queue::reserve`].
    pub async fn reserve_within(
        &self,
        input: ReserveInput,
        room: &dyn reserve::ReplyRoom,
    ) -> Result<Vec<Job>, QueueError> {
        let (spec, lease_ms, wait_ms) = self.reserve_spec(input)?;
        let jobs = reserve::reserve_with_wait(
            &*self.store,
            &*self.clock,
            &self.signals,
            spec,
            lease_ms,
            wait_ms,
            self.limits.max_waiting_reserves,
            room,
            &self.shutdown,
        )
        .await?;
        self.after_reserve(&jobs);
        Ok(jobs)
    }

    /// Checks a Reserve's input; returns its spec (lease expiry still to be set), the clamped
    /// lease and the clamped wait, in ms.
    fn reserve_spec(&self, input: ReserveInput) -> Result<(ReserveSpec, u64, u64), QueueError> {
        let l = &self.limits;
        if input.queues.is_empty() {
            return Err(QueueError::InvalidArgument(
                "queues is empty: list at least one queue".into(),
            ));
        }
        if input.queues.len() > l.max_reserve_queues as usize {
            return Err(QueueError::InvalidArgument(format!(
                "queues has {} entries, max_reserve_queues is {}",
                input.queues.len(),
                l.max_reserve_queues
            )));
        }
        for (i, q) in input.queues.iter().enumerate() {
            validate::check_queue_name(&format!("queues[{i}]"), q, l, NameUse::Read)?;
        }
        if let Some(w) = &input.worker_id {
            validate::check_length("worker_id", w, "max_worker_id_bytes", l.max_worker_id_bytes)?;
        }
        let lease_ms = match input.lease_ms {
            None => {
                return Err(QueueError::InvalidArgument(
                    "lease_duration is missing: it is required and must be positive".into(),
                ));
            }
            Some(ms) if ms <= 0 => {
                return Err(QueueError::InvalidArgument(format!(
                    "lease_duration is {ms} ms: it must be positive"
                )));
            }
            Some(ms) => ms as u64,
        };
        let wait_ms = match input.wait_timeout_ms {
            None => 0,
            Some(ms) if ms < 0 => {
                return Err(QueueError::InvalidArgument(format!(
                    "wait_timeout is {ms} ms: it must not be negative"
                )));
            }
            Some(ms) => (ms as u64).min(l.max_wait_timeout_ms),
        };
        let max_jobs = match input.max_jobs {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "max_jobs is 0: ask for at least 1 job".into(),
                ));
            }
            Some(n) => n.min(l.max_reserve_batch),
            None => 1,
        };
        if l.strict_queues {
            let unknown: Vec<String> = input
                .queues
                .iter()
                .filter(|q| !l.is_declared(q))
                .cloned()
                .collect();
            if !unknown.is_empty() {
                return Err(QueueError::UnknownQueues(unknown));
            }
        }
        let lease_ms = lease::clamp_lease_ms(l, input.queues.iter().map(String::as_str), lease_ms);
        let spec = ReserveSpec {
            queues: input.queues,
            max_jobs,
            lease_expires_at: 0,
            worker_id: input.worker_id,
            max_reply_bytes: l.max_reserve_reply_bytes,
        };
        Ok((spec, lease_ms, wait_ms))
    }

    /// What follows a lease: the sweeper's alarm for its expiry, the reserved counts.
    fn after_reserve(&self, jobs: &[Job]) {
        if let Some(expires) = jobs.first().and_then(|j| j.lease_expires_at) {
            self.sweep_wake.deadline_at(expires);
        }
        if self.metrics.enabled() {
            let mut i = 0;
            while i < jobs.len() {
                let queue = &jobs[i].queue;
                let n = jobs[i..].iter().take_while(|j| &j.queue == queue).count();
                self.metrics.reserved(queue, n as u64);
                i += n;
            }
        }
    }

    fn parse_id(job_id: &str) -> Result<JobId, QueueError> {
        JobId::parse(job_id).ok_or_else(|| {
            // Not a UUID, so never a job: name it in the error, but not at any length.
            QueueError::JobNotInFlight(if job_id.len() <= 64 {
                format!("{job_id:?} (not a UUID, so no job's id)")
            } else {
                format!("({} bytes, not a UUID, so no job's id)", job_id.len())
            })
        })
    }

    fn refusal(job_id: &str, sent: u32, r: SettleRefusal) -> QueueError {
        match r {
            SettleRefusal::NotInFlight => QueueError::JobNotInFlight(job_id.to_string()),
            SettleRefusal::AttemptMismatch { current } => QueueError::AttemptMismatch {
                job_id: job_id.to_string(),
                sent,
                current,
            },
        }
    }

    /// Applies a settlement of `job_id` under `rule`, then raises what it makes due: a ready
    /// signal for a retry that is ready at once, the sweeper's alarm for a new deadline.
    async fn settle(
        &self,
        job_id: &str,
        attempt: u32,
        id: JobId,
        rule: &SettleRule<'_>,
        reason: LastReason,
        now: UnixMs,
    ) -> Result<Settled, QueueError> {
        let settled = self
            .store
            .settle(id, rule, reason, now)
            .await?
            .map_err(|r| Self::refusal(job_id, attempt, r))?;
        self.after_settle(&settled);
        Ok(settled)
    }

    /// Raises what a settlement makes due: a ready signal for a retry that is ready at once,
    /// the sweeper's alarm for a new deadline.
    fn after_settle(&self, settled: &Settled) {
        let Settled { plan, queue } = settled;
        match *plan {
            Settle::Retry(Placement::Ready) => self.signals.job_ready(queue, 1),
            Settle::Retry(Placement::Scheduled { due }) => self.sweep_wake.deadline_at(due),
            Settle::Finish(Finish::DeadLetter { failed_at, .. }) => {
                let keep = i64::try_from(self.limits.dead_letter_retention_ms).unwrap_or(i64::MAX);
                self.sweep_wake.deadline_at(failed_at.saturating_add(keep));
            }
            Settle::Extend { expires } => self.sweep_wake.deadline_at(expires),
            Settle::Finish(Finish::Tombstone { .. } | Finish::Delete) => {}
        }
    }

    fn count_enqueue(&self, queue: &str, outcome: &JobOutcome) {
        match outcome {
            Ok(a) => self.metrics.enqueued(queue, a.deduplicated),
            Err(r) => self.metrics.rejected(r.kind()),
        }
    }

    /// Acks delivery `attempt` of `job_id`.
    ///
    /// The delivery must be in flight under `attempt` with its lease in force
    /// ([`lease::fence`]). What stays of the job: [`lifecycle::finish`].
    ///
    /// # Errors
    /// [`QueueError::JobNotInFlight`], [`QueueError::AttemptMismatch`], [`QueueError::Storage`].
    pub async fn ack(&self, job_id: &str, attempt: u32) -> Result<(), QueueError> {
        let id = Self::parse_id(job_id)?;
        let now = self.clock.now();
        let retention = self.limits.dead_letter_retention_ms;
        let rule = |job: Option<JobFacts<'_>>| Self::ack_rule(job, attempt, retention, now);
        let settled = self
            .settle(job_id, attempt, id, &rule, LastReason::Unchanged, now)
            .await?;
        self.count_ack(&settled, now);
        Ok(())
    }

    /// An ack's rule: the delivery's lease must be in force ([`lease::fence`]); what stays of
    /// the job is [`lifecycle::finish`]'s.
    fn ack_rule(
        job: Option<JobFacts<'_>>,
        attempt: u32,
        retention: u64,
        now: UnixMs,
    ) -> Result<Settle, SettleRefusal> {
        let job = lease::fence(job, attempt, now)?;
        Ok(Settle::Finish(lifecycle::finish(job, None, retention, now)))
    }

    fn count_ack(&self, settled: &Settled, now: UnixMs) {
        self.metrics.acked(&settled.queue);
        self.rates
            .count(&settled.queue, rates::Event::Acked, 1, now);
    }

    /// Acks delivery `attempt` of `job_id` as [`Queue::ack`] does, then leases jobs per `next`
    /// as [`Queue::reserve`] does, without waiting, in the same storage transition where the
    /// backend can: a worker's ack that fetches its next job in the same call.
    ///
    /// Returns `None` when the ack took but the lease failed (the worker then reserves on
    /// its own). `next` is checked before the ack: bad input acks nothing.
    ///
    /// # Errors
    /// As [`Queue::ack`]; and [`QueueError::InvalidArgument`] for `next` as for
    /// [`Queue::reserve`], or a positive `next.wait_timeout` (the lease after an ack never waits).
    pub async fn ack_then_reserve(
        &self,
        job_id: &str,
        attempt: u32,
        next: ReserveInput,
    ) -> Result<Option<Vec<Job>>, QueueError> {
        self.ack_then_reserve_within(job_id, attempt, next, &reserve::Unbounded)
            .await
    }

    /// [`Queue::ack_then_reserve`] whose lease takes each job's reply bytes from `room`; with
    /// no room the ack is done and nothing is leased.
    ///
    /// # Errors
    /// As [`Queue::ack_then_reserve`].
    pub async fn ack_then_reserve_within(
        &self,
        job_id: &str,
        attempt: u32,
        next: ReserveInput,
        room: &dyn reserve::ReplyRoom,
    ) -> Result<Option<Vec<Job>>, QueueError> {
        if let Some(ms) = next.wait_timeout_ms.filter(|ms| *ms > 0) {
            return Err(QueueError::InvalidArgument(format!(
                "then_reserve.wait_timeout is {ms} ms: the lease after an ack does not wait, \
                 leave it unset or zero"
            )));
        }
        // On an ack, FAILED_PRECONDITION means another attempt holds the job: an undeclared
        // queue (strict mode) is this request's mistake, named as its field.
        let (mut spec, lease_ms, _) = self.reserve_spec(next).map_err(|e| match e {
            QueueError::UnknownQueues(q) => QueueError::InvalidArgument(format!(
                "then_reserve.queues lists queues not declared in strict mode: {}",
                q.join(", ")
            )),
            QueueError::InvalidArgument(m) => {
                QueueError::InvalidArgument(format!("then_reserve.{m}"))
            }
            e => e,
        })?;
        let id = Self::parse_id(job_id)?;
        let now = self.clock.now();
        spec.lease_expires_at = now.saturating_add(i64::try_from(lease_ms).unwrap_or(i64::MAX));
        let retention = self.limits.dead_letter_retention_ms;
        let rule = |job: Option<JobFacts<'_>>| Self::ack_rule(job, attempt, retention, now);
        let no_room = std::sync::atomic::AtomicBool::new(false);
        let fit = reserve::fit_within_room(spec.max_reply_bytes, room, &no_room);
        let (settled, jobs) = self
            .store
            .settle_then_reserve(id, &rule, now, &spec, &fit)
            .await?
            .map_err(|r| Self::refusal(job_id, attempt, r))?;
        self.after_settle(&settled);
        self.count_ack(&settled, now);
        if let Some(jobs) = &jobs {
            self.after_reserve(jobs);
        }
        Ok(jobs)
    }

    /// Nacks delivery `attempt` of `job_id`; returns whether it was dead-lettered.
    ///
    /// A retry on the last attempt (attempt ≥ max_attempts) dead-letters the job with cause
    /// `ATTEMPTS_EXHAUSTED`; `dead_letter` dead-letters it with cause `REJECTED`
    /// ([`lifecycle::nack`]). A reason longer than `max_reason_bytes` is kept truncated to it
    /// (at a character boundary).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a negative delay; otherwise as [`Queue::ack`].
    pub async fn nack(
        &self,
        job_id: &str,
        attempt: u32,
        strategy: NackStrategy,
        reason: Option<String>,
    ) -> Result<bool, QueueError> {
        let id = Self::parse_id(job_id)?;
        if let NackStrategy::Delay(ms) = strategy
            && ms < 0
        {
            return Err(QueueError::InvalidArgument(format!(
                "retry.delay is {ms} ms: it must not be negative"
            )));
        }
        let now = self.clock.now();
        let retention = self.limits.dead_letter_retention_ms;
        let limits = &self.limits;
        let rule = |job: Option<JobFacts<'_>>| {
            let job = lease::fence(job, attempt, now)?;
            let policy = limits.policy(job.queue);
            Ok(lifecycle::nack(job, strategy, policy, retention, now))
        };
        let reason = reason.map(|r| validate::truncate_utf8(r, self.limits.max_reason_bytes));
        let settled = self
            .settle(job_id, attempt, id, &rule, LastReason::Set(reason), now)
            .await?;
        self.metrics.nacked(&settled.queue);
        self.rates
            .count(&settled.queue, rates::Event::Nacked, 1, now);
        let dead = matches!(settled.plan, Settle::Finish(_));
        if dead {
            self.rates
                .count(&settled.queue, rates::Event::DeadLettered, 1, now);
            self.metrics
                .dead_lettered(lifecycle::nack_cause(strategy), 1);
        }
        Ok(dead)
    }

    /// Sets the lease of delivery `attempt` of `job_id` to now + `lease_ms` (clamped to the
    /// queue's `max_lease_duration_ms`). Returns the new expiry. A lease that is already over
    /// is not revived ([`lease::fence`]).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a missing, zero or negative duration; otherwise as
    /// [`Queue::ack`].
    pub async fn extend(
        &self,
        job_id: &str,
        attempt: u32,
        lease_ms: Option<i64>,
    ) -> Result<UnixMs, QueueError> {
        let id = Self::parse_id(job_id)?;
        let ms = match lease_ms {
            Some(ms) if ms > 0 => ms as u64,
            Some(ms) => {
                return Err(QueueError::InvalidArgument(format!(
                    "lease_duration is {ms} ms: it must be positive"
                )));
            }
            None => {
                return Err(QueueError::InvalidArgument(
                    "lease_duration is missing: it is required and must be positive".into(),
                ));
            }
        };
        let now = self.clock.now();
        let limits = &self.limits;
        let rule = |job: Option<JobFacts<'_>>| {
            let job = lease::fence(job, attempt, now)?;
            let ms = ms.min(limits.policy(job.queue).max_lease_duration_ms);
            Ok(Settle::Extend {
                expires: now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)),
            })
        };
        match self
            .settle(job_id, attempt, id, &rule, LastReason::Unchanged, now)
            .await?
            .plan
        {
            Settle::Extend { expires } => Ok(expires),
            // The rule above plans nothing else.
            other => Err(QueueError::Storage(StorageError::InvalidPlan(format!(
                "an extend applied {other:?}"
            )))),
        }
    }

    /// Removes and returns up to `max` (default 1, at most [`MAX_DRAIN`]) dead letters,
    /// oldest first, of one queue or all; fewer when more would pass the reply budget
    /// (`max_reserve_reply_bytes`, [`reply::drain_fit`]). A record is removed only if it is
    /// returned; what stays of each: [`lifecycle::leave`].
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for `max = 0`; [`QueueError::Storage`].
    pub async fn drain_dead_letters(
        &self,
        queue: Option<String>,
        max: Option<u32>,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let max = match max {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "max is 0: ask for at least 1 record".into(),
                ));
            }
            Some(n) => n.min(MAX_DRAIN),
            None => 1,
        };
        if let Some(q) = &queue {
            validate::check_queue_name("queue", q, &self.limits, NameUse::Read)?;
        }
        let now = self.clock.now();
        let rule = |job: JobFacts<'_>| lifecycle::dead_letter_removed(job, now);
        let budget = self.limits.max_reserve_reply_bytes;
        let fit = |d: &DeadLetter, used, _| reply::drain_fit(d, used, budget);
        Ok(self
            .store
            .drain_dead_letters(queue.as_deref(), max, &fit, &rule, now)
            .await?)
    }

    /// Version, time and limits.
    pub fn server_info(&self) -> ServerInfo {
        ServerInfo {
            version: env!("CARGO_PKG_VERSION"),
            server_time: self.clock.now(),
            limits: self.limits.clone(),
        }
    }
}

fn insert_outcome(o: InsertOutcome, queue: &str) -> JobOutcome {
    match o {
        InsertOutcome::Created(job_id) => Ok(Accepted {
            job_id,
            deduplicated: false,
            original_state: None,
            replaced: false,
        }),
        InsertOutcome::Deduplicated(job_id, state) => Ok(Accepted {
            job_id,
            deduplicated: true,
            original_state: Some(state),
            replaced: false,
        }),
        InsertOutcome::Replaced(job_id, placement) => Ok(Accepted {
            job_id,
            deduplicated: true,
            original_state: Some(enqueue::placed_state(placement)),
            replaced: true,
        }),
        InsertOutcome::KeyConflict { original } => Err(Rejection::IdempotencyKeyConflict {
            original_job_id: original,
        }),
        InsertOutcome::QueueFull { limit } => Err(Rejection::QueueFull {
            queue: queue.to_string(),
            limit,
        }),
        InsertOutcome::TooManyQueues { limit } => Err(Rejection::TooManyQueues {
            queue: queue.to_string(),
            limit,
        }),
    }
}
