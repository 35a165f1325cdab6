//! [`Engine`] and [`Lease`]: the core's worker engine (`sepp_rs::engine`), for `worker.js` and
//! for anyone writing their own worker loop.
//!
//! Every rule stays in the core: the engine reserves in batches sized to the free slots,
//! long-polls, backs off while the server fails, extends leases, frees the slot of a lost
//! lease without a call, nacks the job types without a handler and the jobs past the handler
//! timeout, settles jobs, drains at shutdown, gives back what it holds when dropped, and
//! counts it all. This module only converts: options in, leases and outcomes across, errors
//! and counts out.
//!
//! A pending Promise of this addon keeps Node's event loop alive; every Promise of a lease
//! (`lost()`, `done()`) resolves once the engine lets go of the job, settled or not, so a
//! process whose worker has stopped can exit.

use crate::client::SeppClient;
use crate::error::{Failure, settle};
use crate::job::Job;
use crate::read::{self, BadInput, Fields};
use crate::value::{self, Date};
use napi::Env;
use napi::bindgen_prelude::{PromiseRaw, ToNapiValue, Unknown};
use napi_derive::napi;
use sepp_rs::LeaseError;
use sepp_rs::engine::{
    EngineOptions as CoreOptions, LeaseEnd as CoreEnd, Outcome as CoreOutcome,
    WorkerReport as CoreReport,
};

/// How an engine reserves and keeps leases. Only `queues` is required.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct EngineOptions {
    /// Queues to reserve from, in priority order; at least one.
    pub queues: Vec<String>,
    /// Lease asked for per job, in milliseconds; positive. The server may clamp it (see
    /// `Lease.expiresAt`).
    /// @default 30000
    pub lease_duration_ms: Option<f64>,
    /// Most jobs held at once (handed out by `next` and not yet completed); at least 1. Each
    /// reserve asks for as many jobs as there are free slots.
    /// @default 10
    pub max_in_flight: Option<f64>,
    /// Extend each held job's lease when a third of it is left, until the job is completed.
    /// Without it a job's lease simply runs out.
    /// @default true
    pub auto_extend: Option<bool>,
    /// Long-poll wait of each reserve, in milliseconds.
    /// @default 5000
    pub wait_timeout_ms: Option<f64>,
    /// Longest pause between reserves while the server fails, in milliseconds (the pause
    /// doubles from 100 ms up to this).
    /// @default 5000
    pub max_backoff_ms: Option<f64>,
    /// A label sent with each reserve, shown by job inspection (`JobInfo.workerId`).
    pub worker_id: Option<String>,
    /// The job types the host has a handler for: a job of another type is nacked with the
    /// queue's retry policy (reason `no handler for job type "T"`) and never handed out.
    /// Unset: every type is handed out.
    pub job_types: Option<Vec<String>>,
    /// The longest a job may stay handed out, in milliseconds; past it the engine nacks it
    /// (reason `the handler ran past handler_timeout (N ms)`) and its `Lease.done()` resolves
    /// with kind `'timedOut'`. Unset: no limit.
    pub handler_timeout_ms: Option<f64>,
    /// How long `drain()` waits for the held jobs to be settled before it nacks the rest, in
    /// milliseconds.
    /// @default 30000
    pub shutdown_timeout_ms: Option<f64>,
}

impl EngineOptions {
    /// Reads the `options` argument of `Engine.start`.
    fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let f = Fields::required(value, "options")?;
        Ok(EngineOptions {
            queues: f.required_strings("queues")?,
            lease_duration_ms: f.number("leaseDurationMs")?,
            max_in_flight: f.number("maxInFlight")?,
            auto_extend: f.boolean("autoExtend")?,
            wait_timeout_ms: f.number("waitTimeoutMs")?,
            max_backoff_ms: f.number("maxBackoffMs")?,
            worker_id: f.string("workerId")?,
            job_types: match f.get("jobTypes")? {
                Some(_) => Some(f.required_strings("jobTypes")?),
                None => None,
            },
            handler_timeout_ms: f.number("handlerTimeoutMs")?,
            shutdown_timeout_ms: f.number("shutdownTimeoutMs")?,
        })
    }

    /// Reads the `options` argument of `Engine.start` or `Engine.checkOptions` into the core's
    /// options: a `TypeError` for a mistyped field, an `InvalidArgumentError` for a value the
    /// core's types cannot hold.
    fn read_core(value: Option<Unknown<'_>>) -> Result<CoreOptions, Failure> {
        Self::read(value)
            .and_then(|o| o.into_core().map_err(BadInput::Value))
            .map_err(|e| e.into_failure(LeaseError::Invalid))
    }

    /// The core's options; unset fields keep the core's defaults.
    fn into_core(self) -> Result<CoreOptions, String> {
        let mut o = CoreOptions::new(self.queues);
        if let Some(ms) = self.lease_duration_ms {
            o.lease_duration = value::duration("options.leaseDurationMs", ms)?;
        }
        if let Some(n) = self.max_in_flight {
            o.max_in_flight = value::uint32("options.maxInFlight", n)? as usize;
        }
        if let Some(on) = self.auto_extend {
            o.auto_extend = on;
        }
        if let Some(ms) = self.wait_timeout_ms {
            o.wait_timeout = value::duration("options.waitTimeoutMs", ms)?;
        }
        if let Some(ms) = self.max_backoff_ms {
            o.max_backoff = value::duration("options.maxBackoffMs", ms)?;
        }
        o.worker_id = self.worker_id;
        o.job_types = self.job_types;
        if let Some(ms) = self.handler_timeout_ms {
            o.handler_timeout = Some(value::duration("options.handlerTimeoutMs", ms)?);
        }
        if let Some(ms) = self.shutdown_timeout_ms {
            o.shutdown_timeout = value::duration("options.shutdownTimeoutMs", ms)?;
        }
        Ok(o)
    }
}

/// What became of a job, as `Engine.settle` reports it: `'success'` acks it; the others nack
/// it, and each dead-letters the job on its last attempt.
#[napi(
    discriminant = "kind",
    discriminant_case = "camelCase",
    object_to_js = false,
    object_from_js = false
)]
pub enum Outcome {
    /// Done: ack.
    Success,
    /// Failed: retry per the queue's policy (`retry_delay_ms`, `retry_backoff`).
    Retry {
        /// Why; kept as the job's last reason (`JobInfo.lastReason`).
        reason: Option<String>,
    },
    /// Failed: retry after `delayMs` milliseconds (clamped to the schedule horizon).
    RetryAfter {
        /// How long to wait, in milliseconds; finite and not negative.
        delay_ms: f64,
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
    /// Reads the `outcome` argument of `settle`.
    fn read(value: Option<Unknown<'_>>) -> Result<Self, BadInput> {
        let f = Fields::required(value, "outcome")?;
        let kind = f.required_string("kind")?;
        Ok(match kind.as_str() {
            "success" => Outcome::Success,
            "retry" => Outcome::Retry {
                reason: f.string("reason")?,
            },
            "retryAfter" => Outcome::RetryAfter {
                delay_ms: f.required_number("delayMs")?,
                reason: f.string("reason")?,
            },
            "permanent" => Outcome::Permanent {
                reason: f.string("reason")?,
            },
            _ => {
                return Err(BadInput::Type(format!(
                    "outcome.kind must be 'success', 'retry', 'retryAfter' or 'permanent', got {kind:?}"
                )));
            }
        })
    }

    /// The core's outcome.
    fn into_core(self) -> Result<CoreOutcome, String> {
        Ok(match self {
            Outcome::Success => CoreOutcome::Success,
            Outcome::Retry { reason } => CoreOutcome::Retry { reason },
            Outcome::RetryAfter { delay_ms, reason } => CoreOutcome::RetryAfter {
                delay: value::duration("outcome.delayMs", delay_ms)?,
                reason,
            },
            Outcome::Permanent { reason } => CoreOutcome::Permanent { reason },
        })
    }
}

/// What a worker run did: counts of jobs, kept by the engine (`WorkerReport` of the worker
/// adds the deprecated names).
#[napi(object, object_from_js = false, js_name = "EngineReport")]
pub struct WorkerReport {
    /// Jobs acked.
    pub acked: u32,
    /// Jobs nacked (retry, delay or dead-letter): thrown errors, job types without a
    /// handler and handlers past `handlerTimeoutMs` included.
    pub nacked: u32,
    /// Jobs whose lease was lost while held, or whose ack or nack failed (their leases run out
    /// and they are delivered again).
    pub lease_lost: u32,
    /// Jobs nacked because the worker shut down before they were settled (or given back
    /// because they were reserved during shutdown).
    pub abandoned: u32,
}

impl From<CoreReport> for WorkerReport {
    fn from(r: CoreReport) -> Self {
        let CoreReport {
            acked,
            nacked,
            lease_lost,
            abandoned,
        } = r;
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        WorkerReport {
            acked: n(acked),
            nacked: n(nacked),
            lease_lost: n(lease_lost),
            abandoned: n(abandoned),
        }
    }
}

/// The span a job's handler runs in, as the core defines it for every language: a span of
/// kind consumer named `name`, with `attributes`, child of `parent` (the job's stored trace
/// context) or, when the job has no valid one, the root of a new trace.
#[napi(object, object_from_js = false)]
pub struct HandlerSpan {
    /// `"sepp.handle"`.
    pub name: String,
    /// OpenTelemetry messaging attributes plus sepp's (`sepp.job_type`, `sepp.attempt`).
    pub attributes: std::collections::HashMap<String, String>,
    /// The job's trace context when its `traceparent` is valid; absent otherwise.
    pub parent: Option<SpanParent>,
}

/// A remote span context in OpenTelemetry's shape, parsed from a W3C `traceparent`.
#[napi(object, object_from_js = false)]
pub struct SpanParent {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The trace flags (bit 0: sampled).
    pub trace_flags: u32,
    /// The `tracestate` header, if any.
    pub trace_state: Option<String>,
}

/// Why the engine let go of a job, as `Lease.done()` resolves: the kind, and a sentence
/// saying so (the `AbortSignal` reason a worker gives a handler it stops).
#[napi(object, object_from_js = false)]
pub struct LeaseEnd {
    /// `'settled'` (by `settle`), `'lost'` (the slot was freed without a call; the server's
    /// lease expiry decides), `'timedOut'` (past `handlerTimeoutMs`; the engine nacked the
    /// job) or `'abandoned'` (the worker shut down; the engine nacked the job).
    #[napi(ts_type = "'settled' | 'lost' | 'timedOut' | 'abandoned'")]
    pub kind: &'static str,
    /// Why, in words.
    pub reason: String,
}

impl From<CoreEnd> for LeaseEnd {
    fn from(end: CoreEnd) -> Self {
        let kind = match end {
            CoreEnd::Settled => "settled",
            CoreEnd::Lost => "lost",
            CoreEnd::TimedOut => "timedOut",
            CoreEnd::Abandoned => "abandoned",
        };
        LeaseEnd {
            kind,
            reason: end.to_string(),
        }
    }
}

/// The worker engine of the core, and the whole policy of a worker: it reserves jobs, keeps
/// their leases, settles them, and counts; the host (such as `Worker`) only asks for the next
/// job, runs its handler until the lease's `done()` resolves, and reports what became of it.
///
/// - A poller reserves in batches sized to the free slots (`maxInFlight` minus the jobs held),
///   long-polls, and backs off exponentially (up to `maxBackoffMs`) while the server fails.
/// - With `autoExtend`, each held job's lease is extended when a third of it is left. A lease
///   lost anyway (expired, redelivered) frees its slot without a call, and the job's
///   `Lease.done()` resolves with kind `'lost'`.
/// - `jobTypes` and `handlerTimeoutMs` let the engine nack the jobs nobody handles and the
///   jobs whose handler takes too long.
/// - `shutdown` stops reserving: a waiting reserve is cancelled (it leases nothing), and jobs
///   reserved but not yet handed out are released at once; `drain` then waits up to
///   `shutdownTimeoutMs` for the held jobs and nacks the rest.
///
/// Create it with `Engine.start`. Methods reject with a `TypeError` for a missing or mistyped
/// argument, and with a `SeppError` subclass otherwise. Collected while it holds jobs, it
/// nacks them.
#[napi]
pub struct Engine {
    core: sepp_rs::engine::Engine,
}

#[napi]
impl Engine {
    /// Starts an engine over `client`: its poller begins reserving at once (the client may
    /// still be used for other calls).
    ///
    /// Rejects with `InvalidArgumentError` for no queues, a lease that is not positive,
    /// `maxInFlight` 0 or a negative duration.
    ///
    /// @example
    /// const engine = await Engine.start(client, { queues: ["emails"], maxInFlight: 4 });
    #[napi(
        ts_args_type = "client: SeppClient, options: EngineOptions",
        ts_return_type = "Promise<Engine>"
    )]
    pub fn start<'env>(
        env: &'env Env,
        client: &SeppClient,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Engine>> {
        let call = (|| -> Result<_, Failure> {
            let options = EngineOptions::read_core(options)?;
            Ok((client.core()?, options))
        })();
        settle(
            env,
            async move {
                let (client, options) = call?;
                // Inside the addon's runtime: the engine spawns its poller here.
                Ok(sepp_rs::engine::Engine::start(client, options)?)
            },
            |core| Engine { core },
        )
    }

    /// Throws what `start` would reject `options` with (a `TypeError` or an
    /// `InvalidArgumentError`), at once; returns nothing when they would do. `Worker`'s
    /// constructor calls it, so that a mistake shows where the worker is made.
    #[napi(ts_args_type = "options: EngineOptions")]
    pub fn check_options(env: &Env, options: Option<Unknown<'_>>) -> napi::Result<()> {
        EngineOptions::read_core(options)
            .and_then(|o| o.check().map_err(Failure::from))
            .map_err(|f| crate::error::rejection(env, f))
    }

    /// The next job to process, with its lease; waits until one is reserved. Resolves to
    /// `null` once the engine is shut down. Call it again for each job: the engine hands out
    /// at most `maxInFlight` jobs that are not yet completed.
    #[napi(ts_return_type = "Promise<Lease | null>")]
    pub fn next<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, Option<Lease>>> {
        let core = self.core.clone();
        settle(
            env,
            async move { Ok(core.next().await.map(|core| Lease { core })) },
            |lease| lease,
        )
    }

    /// Settles delivery `attempt` of job `jobId`, handed out by `next`: acks it for
    /// `{ kind: 'success' }`, nacks it otherwise; frees its slot either way. The engine counts
    /// the job (`report`) whatever happens.
    ///
    /// Rejects with `JobNotInFlightError` when the engine no longer holds the job (lost,
    /// timed out, abandoned, or settled already: nothing is sent) or the server says the lease
    /// is lost, `AttemptMismatchError` when the job was redelivered, `InvalidArgumentError`
    /// for a negative `delayMs`, or `TransportError` and the like when the call failed (the
    /// lease then runs out and the job is redelivered).
    #[napi(
        ts_args_type = "jobId: string, attempt: number, outcome: Outcome",
        ts_return_type = "Promise<void>"
    )]
    pub fn settle<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
        outcome: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let call = (|| -> Result<_, BadInput> {
            let job_id = read::string(job_id, "jobId")?;
            let attempt = read::number(attempt, "attempt")?;
            let attempt = value::uint32("attempt", attempt).map_err(BadInput::Value)?;
            let outcome = Outcome::read(outcome)?
                .into_core()
                .map_err(BadInput::Value)?;
            Ok((job_id, attempt, outcome))
        })()
        .map_err(|e| e.into_failure(LeaseError::Invalid))
        // Called here, not in the future: the engine lets go of the job before this returns,
        // so a stop that begins before the promise settles does not count it as running.
        .map(|(job_id, attempt, outcome)| self.core.settle(&job_id, attempt, outcome));
        settle(
            env,
            async move {
                let call = call?;
                Ok(call.await?)
            },
            |()| (),
        )
    }

    /// The former name of `settle`.
    /// @deprecated Use `settle`.
    #[napi(
        ts_args_type = "jobId: string, attempt: number, outcome: Outcome",
        ts_return_type = "Promise<void>"
    )]
    pub fn complete<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
        outcome: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        self.settle(env, job_id, attempt, outcome)
    }

    /// Stops reserving: a waiting `next` resolves to `null`, a reserve in progress is
    /// cancelled, and jobs reserved but not yet handed out are released. Jobs already handed
    /// out stay held until completed or abandoned. Calling it again does nothing.
    #[napi]
    pub fn shutdown(&self) {
        self.core.shutdown();
    }

    /// Whether `shutdown` was called.
    #[napi(getter)]
    pub fn is_shut_down(&self) -> bool {
        self.core.is_shut_down()
    }

    /// What a worker tells its user as a stop begins with jobs still held: how many, how long
    /// the stop may wait for them, and what becomes of the rest; `null` when none is held.
    #[napi]
    pub fn stop_notice(&self) -> Option<String> {
        self.core.stop_notice()
    }

    /// Why the engine stopped by itself, or `null`: the server refused a reserve with an error
    /// no retry can mend (`UnauthenticatedError`, `PermissionDeniedError`,
    /// `InvalidArgumentError`, `FailedPreconditionError` for a queue strict mode does not
    /// know, `UnsupportedError`). The engine then shuts down as `shutdown` does; a `Worker`'s
    /// `run()` drains and rejects with this error.
    #[napi(ts_return_type = "Error | null")]
    pub fn failure<'env>(&self, env: &'env Env) -> napi::Result<Option<Unknown<'env>>> {
        let Some(e) = self.core.failure() else {
            return Ok(None);
        };
        // SAFETY: runs on the JavaScript thread with the live `env` of this call.
        let raw = unsafe { Failure::to_napi_value(env.raw(), Failure::from(e))? };
        // SAFETY: `raw` was just created in `env`.
        Ok(Some(unsafe { Unknown::from_raw_unchecked(env.raw(), raw) }))
    }

    /// Jobs held (handed out, or reserved and waiting to be), not yet settled.
    #[napi(getter)]
    pub fn in_flight(&self) -> u32 {
        u32::try_from(self.core.in_flight()).unwrap_or(u32::MAX)
    }

    /// Waits until no job is held, or `timeoutMs` milliseconds pass. Resolves to whether it
    /// got idle.
    ///
    /// Rejects with `InvalidArgumentError` for a negative `timeoutMs`.
    #[napi(
        ts_args_type = "timeoutMs: number",
        ts_return_type = "Promise<boolean>"
    )]
    pub fn wait_idle<'env>(
        &self,
        env: &'env Env,
        timeout_ms: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, bool>> {
        let timeout = read::number(timeout_ms, "timeoutMs")
            .and_then(|ms| value::duration("timeoutMs", ms).map_err(BadInput::Value))
            .map_err(|e| e.into_failure(LeaseError::Invalid));
        let core = self.core.clone();
        settle(
            env,
            async move { Ok(core.wait_idle(timeout?).await) },
            |idle| idle,
        )
    }

    /// Shuts down gracefully: stops reserving, waits up to `shutdownTimeoutMs` (or until
    /// `endGracePeriod()`) for the held jobs to be settled, then nacks the rest with the
    /// queue's retry policy and the reason `worker shut down before the job finished`; their
    /// leases' `done()` resolve with kind `'abandoned'`. Resolves to how many were nacked.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn drain<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, u32>> {
        let core = self.core.clone();
        settle(
            env,
            async move { Ok(u32::try_from(core.drain().await).unwrap_or(u32::MAX)) },
            |n| n,
        )
    }

    /// Ends the grace period of a running (or the next) `drain()` at once.
    #[napi]
    pub fn end_grace_period(&self) {
        self.core.end_grace_period();
    }

    /// The counts of the run so far.
    #[napi(getter, ts_return_type = "EngineReport")]
    pub fn report(&self) -> WorkerReport {
        self.core.report().into()
    }

    /// Nacks every job still held, with the queue's retry policy and `reason` (kept as the
    /// jobs' last reason); their leases' `done()` resolve with kind `'abandoned'`. Resolves
    /// to how many were nacked.
    #[napi(ts_args_type = "reason: string", ts_return_type = "Promise<number>")]
    pub fn abandon_all<'env>(
        &self,
        env: &'env Env,
        reason: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, u32>> {
        let reason =
            read::string(reason, "reason").map_err(|e| e.into_failure(LeaseError::Invalid));
        let core = self.core.clone();
        settle(
            env,
            async move {
                let n = core.abandon_all(&reason?).await;
                Ok(u32::try_from(n).unwrap_or(u32::MAX))
            },
            |n| n,
        )
    }
}

/// A job handed out by `Engine.next`, with its lease.
#[napi]
pub struct Lease {
    core: sepp_rs::engine::Lease,
}

#[napi]
impl Lease {
    /// The job (a new object on each read).
    #[napi(getter)]
    pub fn job(&self) -> Job {
        Job::from(self.core.job.clone())
    }

    /// Resolves once the engine has let go of the job, with why (see `LeaseEnd`). Before the
    /// job is settled, any kind means: stop its handler, the engine did what the job needs.
    /// Never rejects; resolves for every job, so it never keeps the process alive after.
    #[napi(ts_return_type = "Promise<LeaseEnd>")]
    pub fn done<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, LeaseEnd>> {
        let lease = self.core.clone();
        settle(env, async move { Ok(lease.done().await) }, LeaseEnd::from)
    }

    /// Resolves to `true` when the lease is known to be lost (an extension found the job gone
    /// or under another attempt, or the lease ran out), to `false` once the engine let go of
    /// the job otherwise (settled, timed out, abandoned), so the Promise never keeps the
    /// process alive after the job is done. Never rejects.
    #[napi(ts_return_type = "Promise<boolean>")]
    pub fn lost<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, bool>> {
        let lease = self.core.clone();
        settle(env, async move { Ok(lease.ended().await) }, |lost| lost)
    }

    /// Whether the lease is known to be lost.
    #[napi]
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// The span the job's handler runs in (`Worker` starts it through OpenTelemetry's API when
    /// `@opentelemetry/api` is installed): the core's name, attributes and parent for this job.
    #[napi]
    pub fn handler_span(&self) -> HandlerSpan {
        let s = sepp_rs::trace::handler_span(&self.core.job);
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let parent = s.parent.and_then(|t| {
            let p = sepp_rs::trace::parse_traceparent(&t.traceparent)?;
            Some(SpanParent {
                trace_id: hex(&p.trace_id),
                span_id: hex(&p.span_id),
                trace_flags: u32::from(p.flags),
                trace_state: t.tracestate,
            })
        });
        HandlerSpan {
            name: s.name.to_string(),
            attributes: s
                .attributes
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            parent,
        }
    }

    /// The lease's current expiry, moved by auto-extension; `null` when the server gave none.
    #[napi(getter, ts_return_type = "Date | null")]
    pub fn expires_at(&self) -> Option<Date> {
        self.core.expires_at().map(Date::from)
    }
}
