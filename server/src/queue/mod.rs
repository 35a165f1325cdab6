//! What a durable job queue means: the rules of `docs/` and the spec, on domain types.
//!
//! [`Queue`] is the one entry point the gRPC edge calls. It validates and resolves requests
//! (pure functions in [`validate`], [`dedup`], [`lease`], [`backoff`], [`limits`]), hands one
//! atomic transition to the [`Store`], and turns the result into domain outcomes. Waiting
//! (long-poll Reserve) lives in [`reserve`]; background expiry in [`sweeper`].

pub mod admin;
pub mod backoff;
pub mod dedup;
pub mod lease;
pub mod limits;
pub mod model;
pub mod reply;
pub mod reserve;
pub mod sweeper;
pub mod validate;

use self::limits::Limits;
use self::model::{
    Accepted, DeadLetter, DeadLetterCause, EnqueueInput, Job, JobId, JobOutcome, NackPlan,
    Rejection, ReserveSpec, SettleRefusal, UnixMs, now_ms,
};
use self::validate::NameUse;
use crate::error::QueueError;
use crate::storage::{InsertOutcome, ReadySignals, Store};
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
    signals: Arc<ReadySignals>,
    /// Cancelled at shutdown: waiting Reserves return empty.
    shutdown: CancellationToken,
}

impl Queue {
    /// A queue over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        limits: Arc<Limits>,
        signals: Arc<ReadySignals>,
        shutdown: CancellationToken,
    ) -> Self {
        Queue {
            store,
            limits,
            signals,
            shutdown,
        }
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
        let now = now_ms();
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
                Err(r) => outcomes.push(Some(Err(r))),
            }
        }
        if !valid.is_empty() {
            let queues: Vec<Arc<str>> = valid.iter().map(|j| j.queue.clone()).collect();
            let inserted = self.store.enqueue(valid, false, now).await?;
            for ((slot, outcome), queue) in slots.into_iter().zip(inserted).zip(queues) {
                outcomes[slot] = Some(insert_outcome(outcome, &queue));
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
        let now = now_ms();
        let mut valid = Vec::with_capacity(inputs.len());
        let mut failures = Vec::new();
        for (i, input) in inputs.into_iter().enumerate() {
            match validate::validate_job(input, &self.limits, now) {
                Ok(job) => valid.push(job),
                Err(r) => failures.push((i as u32, r)),
            }
        }
        if !failures.is_empty() {
            return Ok(Err(failures));
        }
        let queues: Vec<Arc<str>> = valid.iter().map(|j| j.queue.clone()).collect();
        let inserted = self.store.enqueue(valid, true, now).await?;
        let mut acks = Vec::with_capacity(inserted.len());
        for (i, (outcome, queue)) in inserted.into_iter().zip(queues).enumerate() {
            match insert_outcome(outcome, &queue) {
                Ok(a) => acks.push(a),
                Err(r) => failures.push((i as u32, r)),
            }
        }
        if failures.is_empty() {
            Ok(Ok(acks))
        } else {
            Ok(Err(failures))
        }
    }

    /// Leases up to `max_jobs` ready jobs, waiting up to the (clamped) wait timeout for one.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for no queues, too many queues, a missing, zero or
    /// negative lease, a negative wait, `max_jobs = 0` or a malformed queue name;
    /// [`QueueError::UnknownQueues`] in strict mode; [`QueueError::Storage`].
    pub async fn reserve(&self, input: ReserveInput) -> Result<Vec<Job>, QueueError> {
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
        let spec = ReserveSpec {
            lease_ms: lease::clamp_lease_ms(l, input.queues.iter().map(String::as_str), lease_ms),
            queues: input.queues,
            max_jobs,
            worker_id: input.worker_id,
            max_reply_bytes: l.max_reserve_reply_bytes,
        };
        Ok(
            reserve::reserve_with_wait(&*self.store, &self.signals, &spec, wait_ms, &self.shutdown)
                .await?,
        )
    }

    fn parse_id(job_id: &str) -> Result<JobId, QueueError> {
        JobId::parse(job_id).ok_or_else(|| {
            // Not a UUID, so never a job: name it in the error, but not at any length.
            QueueError::JobNotInFlight(if job_id.len() <= 64 {
                job_id.to_string()
            } else {
                format!("({} bytes, not a job id)", job_id.len())
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

    /// Acks delivery `attempt` of `job_id`.
    ///
    /// # Errors
    /// [`QueueError::JobNotInFlight`], [`QueueError::AttemptMismatch`], [`QueueError::Storage`].
    pub async fn ack(&self, job_id: &str, attempt: u32) -> Result<(), QueueError> {
        let id = Self::parse_id(job_id)?;
        self.store
            .ack(id, attempt, now_ms())
            .await?
            .map_err(|r| Self::refusal(job_id, attempt, r))
    }

    /// Nacks delivery `attempt` of `job_id`; returns whether it was dead-lettered.
    ///
    /// A retry on the last attempt (attempt ≥ max_attempts) dead-letters the job with cause
    /// `ATTEMPTS_EXHAUSTED`; `dead_letter` dead-letters it with cause `REJECTED`. A reason
    /// longer than `max_reason_bytes` is kept truncated to it (at a character boundary).
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
        let now = now_ms();
        let Some(f) = self.store.in_flight(id).await? else {
            return Err(QueueError::JobNotInFlight(job_id.to_string()));
        };
        if f.attempt != attempt {
            return Err(Self::refusal(
                job_id,
                attempt,
                SettleRefusal::AttemptMismatch { current: f.attempt },
            ));
        }
        let policy = self.limits.policy(&f.queue);
        let plan = match strategy {
            NackStrategy::DeadLetter => NackPlan::DeadLetter(DeadLetterCause::Rejected),
            _ if attempt >= f.max_attempts => {
                NackPlan::DeadLetter(DeadLetterCause::AttemptsExhausted)
            }
            NackStrategy::Default => NackPlan::Retry {
                ready_at: now.saturating_add(backoff::retry_delay_ms(policy, id, attempt) as i64),
            },
            NackStrategy::Delay(ms) => NackPlan::Retry {
                ready_at: now
                    .saturating_add((ms as u64).min(policy.max_schedule_horizon_ms) as i64),
            },
        };
        let reason = reason.map(|r| validate::truncate_utf8(r, self.limits.max_reason_bytes));
        self.store
            .nack(id, attempt, plan, reason, now)
            .await?
            .map_err(|r| Self::refusal(job_id, attempt, r))
    }

    /// Sets the lease of delivery `attempt` of `job_id` to now + `lease_ms` (clamped to the
    /// queue's `max_lease_duration_ms`). Returns the new expiry.
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
        let Some(f) = self.store.in_flight(id).await? else {
            return Err(QueueError::JobNotInFlight(job_id.to_string()));
        };
        let ms = ms.min(self.limits.policy(&f.queue).max_lease_duration_ms);
        self.store
            .extend(id, attempt, ms, now_ms())
            .await?
            .map_err(|r| Self::refusal(job_id, attempt, r))
    }

    /// Removes and returns up to `max` (default 1, at most [`MAX_DRAIN`]) dead letters,
    /// oldest first, of one queue or all; fewer when more would pass the reply budget
    /// (`max_reserve_reply_bytes`). A record is removed only if it is returned.
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
        Ok(self
            .store
            .drain_dead_letters(queue.as_deref(), max, self.limits.max_reserve_reply_bytes)
            .await?)
    }

    /// Version, time and limits.
    pub fn server_info(&self) -> ServerInfo {
        ServerInfo {
            version: env!("CARGO_PKG_VERSION"),
            server_time: now_ms(),
            limits: self.limits.clone(),
        }
    }
}

fn insert_outcome(o: InsertOutcome, queue: &str) -> JobOutcome {
    match o {
        InsertOutcome::Created(job_id) => Ok(Accepted {
            job_id,
            deduplicated: false,
        }),
        InsertOutcome::Deduplicated(job_id) => Ok(Accepted {
            job_id,
            deduplicated: true,
        }),
        InsertOutcome::QueueFull { limit } => Err(Rejection::QueueFull {
            queue: queue.to_string(),
            limit,
        }),
    }
}
