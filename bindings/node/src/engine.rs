//! [`Engine`] and [`Lease`]: the core's worker engine (`sepp_rs::engine`), for `worker.js` and
//! for anyone writing their own worker loop.
//!
//! Every rule stays in the core: the engine reserves in batches sized to the free slots,
//! long-polls, backs off while the server fails, extends leases, settles jobs and releases
//! what was reserved during shutdown. This module only converts: options in, leases and
//! outcomes across, errors out.
//!
//! The one thing added here is Promise lifetime. A pending Promise of this addon keeps Node's
//! event loop alive, and the core's `Lease::lost` never resolves for a job that was settled
//! (nothing is lost then). So each lease handed out gets a `settled` channel whose sender the
//! engine keeps until the job is completed or abandoned; dropping it resolves the lease's
//! `lost()` Promises with `false`, and a process whose worker has stopped can exit.

use crate::client::SeppClient;
use crate::error::{Failure, settle};
use crate::job::Job;
use crate::read::{self, BadInput, Fields};
use crate::value::{self, Date};
use napi::Env;
use napi::bindgen_prelude::{PromiseRaw, Unknown};
use napi::tokio::sync::watch;
use napi_derive::napi;
use sepp_rs::LeaseError;
use sepp_rs::engine::{EngineOptions as CoreOptions, Outcome as CoreOutcome};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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
        })
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
        Ok(o)
    }
}

/// What became of a job, as `Engine.complete` reports it: `'success'` acks it; the others nack
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
    /// Reads the `outcome` argument of `complete`.
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

/// The `settled` senders of the leases handed out and not yet completed or abandoned, by job
/// id. Owned by the [`Engine`]; `next` adds one, `complete` and `abandonAll` drop them, which
/// resolves the matching `Lease.lost()` Promises with `false`.
type Settled = Arc<Mutex<HashMap<String, watch::Sender<()>>>>;

/// The worker engine of the core: it reserves jobs, keeps their leases and settles them; the
/// host (such as `Worker`) only asks for the next job and reports what became of it.
///
/// - A poller reserves in batches sized to the free slots (`maxInFlight` minus the jobs held),
///   long-polls, and backs off exponentially (up to `maxBackoffMs`) while the server fails.
/// - With `autoExtend`, each held job's lease is extended when a third of it is left; if it is
///   lost anyway (expired, redelivered), the job's `Lease.lost()` resolves with `true`.
/// - `shutdown` stops reserving: a waiting reserve is cancelled (it leases nothing), and jobs
///   reserved but not yet handed out are released at once; `abandonAll` nacks whatever is
///   still held once the host's grace period is over.
///
/// Create it with `Engine.start`. Methods reject with a `TypeError` for a missing or mistyped
/// argument, and with a `SeppError` subclass otherwise.
#[napi]
pub struct Engine {
    core: sepp_rs::engine::Engine,
    settled: Settled,
    /// The addon's runtime, for the abandon on drop (a spawn there after the runtime shut down
    /// at process exit is dropped, where napi's own `spawn` would panic).
    runtime: napi::tokio::runtime::Handle,
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
            let options = EngineOptions::read(options)
                .and_then(|o| o.into_core().map_err(BadInput::Value))
                .map_err(|e| e.into_failure(LeaseError::Invalid))?;
            Ok((client.core()?, options))
        })();
        settle(
            env,
            async move {
                let (client, options) = call?;
                // Inside the addon's runtime: the engine spawns its poller here.
                let core = sepp_rs::engine::Engine::start(client, options)?;
                Ok((core, napi::tokio::runtime::Handle::current()))
            },
            |(core, runtime)| Engine {
                core,
                settled: Settled::default(),
                runtime,
            },
        )
    }

    /// The next job to process, with its lease; waits until one is reserved. Resolves to
    /// `null` once the engine is shut down. Call it again for each job: the engine hands out
    /// at most `maxInFlight` jobs that are not yet completed.
    #[napi(ts_return_type = "Promise<Lease | null>")]
    pub fn next<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, Option<Lease>>> {
        let (core, settled) = (self.core.clone(), self.settled.clone());
        settle(
            env,
            async move {
                let Some(lease) = core.next().await else {
                    return Ok(None);
                };
                let (tx, rx) = watch::channel(());
                settled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(lease.job.id.clone(), tx);
                Ok(Some(Lease {
                    core: lease,
                    settled: rx,
                }))
            },
            |lease| lease,
        )
    }

    /// Settles delivery `attempt` of job `jobId`, handed out by `next`: acks it for
    /// `{ kind: 'success' }`, nacks it otherwise; frees its slot either way.
    ///
    /// Rejects with `JobNotInFlightError` or `AttemptMismatchError` when the lease was lost (the job
    /// will be, or was, delivered again), `InvalidArgumentError` for a negative `delayMs`, or
    /// `TransportError` and the like when the call failed (the lease then runs out and the job is
    /// redelivered).
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
        let call = (|| -> Result<_, BadInput> {
            let job_id = read::string(job_id, "jobId")?;
            let attempt = read::number(attempt, "attempt")?;
            let attempt = value::uint32("attempt", attempt).map_err(BadInput::Value)?;
            let outcome = Outcome::read(outcome)?
                .into_core()
                .map_err(BadInput::Value)?;
            Ok((job_id, attempt, outcome))
        })()
        .map_err(|e| e.into_failure(LeaseError::Invalid));
        let (core, settled) = (self.core.clone(), self.settled.clone());
        settle(
            env,
            async move {
                let (job_id, attempt, outcome) = call?;
                settled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&job_id);
                Ok(core.complete(&job_id, attempt, outcome).await?)
            },
            |()| (),
        )
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

    /// Nacks every job still held, with the queue's retry policy and `reason` (kept as the
    /// jobs' last reason), and resolves their leases' `lost()` with `false`. Resolves to how
    /// many were nacked. Meant for the end of a shutdown grace period, after `shutdown`.
    #[napi(ts_args_type = "reason: string", ts_return_type = "Promise<number>")]
    pub fn abandon_all<'env>(
        &self,
        env: &'env Env,
        reason: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, u32>> {
        let reason =
            read::string(reason, "reason").map_err(|e| e.into_failure(LeaseError::Invalid));
        let (core, settled) = (self.core.clone(), self.settled.clone());
        settle(
            env,
            async move {
                let n = core.abandon_all(&reason?).await;
                settled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
                Ok(u32::try_from(n).unwrap_or(u32::MAX))
            },
            |n| n,
        )
    }
}

impl Drop for Engine {
    /// The JavaScript object was collected, so nobody can complete its jobs any more: stop
    /// reserving and give back what is held, instead of extending those leases forever.
    fn drop(&mut self) {
        self.core.shutdown();
        if self.core.in_flight() > 0 {
            let core = self.core.clone();
            self.runtime.spawn(async move {
                core.abandon_all("engine dropped before the job was completed")
                    .await
            });
        }
    }
}

/// A job handed out by `Engine.next`, with its lease.
#[napi]
pub struct Lease {
    core: sepp_rs::engine::Lease,
    /// Ends (its sender is dropped) when the engine settles or abandons the job.
    settled: watch::Receiver<()>,
}

#[napi]
impl Lease {
    /// The job (a new object on each read).
    #[napi(getter)]
    pub fn job(&self) -> Job {
        Job::from(self.core.job.clone())
    }

    /// Resolves to `true` when the lease is known to be lost (an extension found the job gone
    /// or under another attempt, or the lease expired while extensions failed): stop working
    /// on the job, it is someone else's now. Resolves to `false` once the job is completed or
    /// abandoned without that happening, so the Promise never keeps the process alive after
    /// the job is done. Never rejects.
    ///
    /// Loss is only noticed by auto-extension: with `autoExtend: false` a lease that runs out
    /// is not reported here.
    #[napi(ts_return_type = "Promise<boolean>")]
    pub fn lost<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, bool>> {
        let (lease, mut settled) = (self.core.clone(), self.settled.clone());
        settle(
            env,
            async move {
                napi::tokio::select! {
                    biased;
                    () = lease.lost() => Ok(true),
                    // Only ever an `Err`: nothing is sent, the sender is dropped.
                    _ = settled.changed() => Ok(lease.is_lost()),
                }
            },
            |lost| lost,
        )
    }

    /// Whether the lease is known to be lost.
    #[napi]
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// The lease's current expiry, moved by auto-extension; `null` when the server gave none.
    #[napi(getter, ts_return_type = "Date | null")]
    pub fn expires_at(&self) -> Option<Date> {
        self.core.expires_at().map(Date::from)
    }
}
