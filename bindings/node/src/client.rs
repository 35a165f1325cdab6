//! [`SeppClient`]: the core client's calls, in the core's order, each returning a Promise.
//!
//! Each method reads its arguments (a `TypeError` when one is missing or mistyped), converts
//! them to the core's types (the operation's sepp error when a value cannot be held), and
//! runs the core call on the addon's tokio runtime. Nothing is sent before all of that passed.

use crate::error::{Failure, SeppFailure, settle, settle_with};
use crate::job::{AtomicResult, DeadLetterRecord, EnqueueAck, EnqueueResult, Job, ServerInfo};
use crate::read::{self, BadInput};
use crate::request::{
    ConnectOptions, DrainDeadLettersOptions, EnqueueRequest, NackOptions, ReserveOptions,
};
use crate::value::{self, Date};
use napi::Env;
use napi::bindgen_prelude::{PromiseRaw, Unknown};
use napi_derive::napi;
use sepp_rs::{BatchError, ErrorCode, LeaseError, Rejection, ReserveError};
use std::sync::{Mutex, PoisonError};

/// A client of a sepp server (or any server of the `sepp.v1` protocol).
///
/// One connection, shared by every call; calls may run concurrently. Create it with
/// `SeppClient.connect`. An open client does not keep the process alive: only calls in
/// flight do.
///
/// Errors: every method rejects with a `TypeError` when an argument is missing or has the
/// wrong type, and with a `SeppError` subclass (picked by its `code`) otherwise; `retryable`
/// tells whether the same call may succeed later.
#[napi]
pub struct SeppClient {
    /// The core client; `None` once closed. Each call clones it (clones share the
    /// connection), so `close` refuses new calls while calls in flight finish; the connection
    /// closes when the last of them ends.
    inner: Mutex<Option<sepp_rs::SeppClient>>,
}

/// The operation's error for an argument value that cannot be used.
fn invalid_config(message: String) -> SeppFailure {
    SeppFailure::new(ErrorCode::InvalidConfig, message)
}

/// Reads the array argument `requests` (a `TypeError` for a mistyped one) and converts each
/// request, a slot that cannot be held carrying its rejection.
fn core_requests(
    requests: Option<Unknown<'_>>,
) -> Result<Vec<Result<sepp_rs::EnqueueRequest, Rejection>>, Failure> {
    let read = read::array(requests, "requests", |v, path| {
        EnqueueRequest::read(Some(v), path)
    })
    .map_err(|e| e.into_failure(BatchError::Invalid))?;
    Ok(read.into_iter().map(EnqueueRequest::into_core).collect())
}

/// The caller's current trace context as `sepp.js` read it from OpenTelemetry's API, when
/// installed (`tracing.js`).
fn current(
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> Option<sepp_rs::TraceContext> {
    traceparent.map(|traceparent| sepp_rs::TraceContext {
        traceparent,
        tracestate,
    })
}

/// A request with the trace context it sends, by the core's rule (`sepp_rs::trace::current_or`).
fn with_trace(
    request: Result<sepp_rs::EnqueueRequest, Rejection>,
    current: &Option<sepp_rs::TraceContext>,
) -> Result<sepp_rs::EnqueueRequest, Rejection> {
    request.map(|mut r| {
        r.trace_context = sepp_rs::trace::current_or(r.trace_context.as_ref(), current.clone());
        r
    })
}

/// Reads the `jobId` and `attempt` arguments of ack, nack and extend.
fn delivery(
    job_id: Option<Unknown<'_>>,
    attempt: Option<Unknown<'_>>,
) -> Result<(String, u32), BadInput> {
    let job_id = read::string(job_id, "jobId")?;
    let attempt = read::number(attempt, "attempt")?;
    let attempt = value::uint32("attempt", attempt).map_err(BadInput::Value)?;
    Ok((job_id, attempt))
}

#[napi]
impl SeppClient {
    /// Connects to `url` (`http://host:port`, `https://host:port` or `host:port`), then reads
    /// the server's limits, so that requests are checked against them before sending.
    ///
    /// Rejects with `InvalidConfigError` for an unusable url or option value (a negative
    /// duration), `TransportError` when the server cannot be reached, `UnauthenticatedError` for a
    /// missing or wrong API key.
    ///
    /// @example
    /// const client = await SeppClient.connect("http://127.0.0.1:50051", { apiKey: "secret" });
    #[napi(
        ts_args_type = "url: string, options?: ConnectOptions",
        ts_return_type = "Promise<SeppClient>"
    )]
    pub fn connect<'env>(
        env: &'env Env,
        url: Option<Unknown<'env>>,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, SeppClient>> {
        let builder = (|| -> Result<_, Failure> {
            let url = read::string(url, "url").map_err(|e| e.into_failure(invalid_config))?;
            let options =
                ConnectOptions::read(options).map_err(|e| e.into_failure(invalid_config))?;
            let builder = options
                .apply(sepp_rs::SeppClient::builder(url))
                .map_err(invalid_config)?;
            Ok(builder)
        })();
        settle(
            env,
            async move { Ok(builder?.connect().await?) },
            |client| SeppClient {
                inner: Mutex::new(Some(client)),
            },
        )
    }

    /// Closes the client: later calls reject with an `Error` whose code is
    /// `ERR_SEPP_CLIENT_CLOSED`; calls in flight finish, then the connection closes. Calling
    /// it again does nothing.
    #[napi]
    pub fn close(&self) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// The core client, or [`Failure::Closed`].
    pub(crate) fn core(&self) -> Result<sepp_rs::SeppClient, Failure> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Failure::Closed)
    }

    /// Enqueues one job.
    ///
    /// The request is checked when this is called, before anything is sent, by the core (as
    /// in every language): its structure (a valid queue name, a non-empty job type, priority 0
    /// to 9, ...; a value that cannot be held, such as a fractional priority, is
    /// `InvalidRequestError` too), then the lengths up to the idempotency key's against the
    /// limits the server advertised at connect. A job that fails the checks is rejected
    /// alone and never joins a batch.
    ///
    /// Enqueues made concurrently on one client leave together as one `EnqueueBatch` call
    /// while the client's batches in flight are busy (`coalesce`, on by default); the result
    /// is still this job's own. A promise cannot be cancelled: once called, the job leaves.
    ///
    /// Rejects with the job's `JobRejectedError` subclass (`IdempotencyKeyTooLongError` with
    /// `limit` and `actual` in bytes, `InvalidRequestError`, `PayloadTooLargeError`,
    /// `QueueFullError`, ...), or `TransportError`, `UnauthenticatedError`, `OverloadedError`,
    /// `ServerFaultError` when the call fails. A keyed enqueue is always safe to retry: a
    /// repeat is a dedup hit.
    ///
    /// @example
    /// const ack = await client.enqueue({ queue: "emails", jobType: "welcome", idempotencyKey: "user-42" });
    #[napi(
        ts_args_type = "request: EnqueueRequest",
        ts_return_type = "Promise<EnqueueAck>"
    )]
    pub fn enqueue<'env>(
        &self,
        env: &'env Env,
        request: Option<Unknown<'env>>,
        // Not in the declarations: sepp.js passes the caller's current trace context here.
        current_traceparent: Option<String>,
        current_tracestate: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, EnqueueAck>> {
        let current = current(current_traceparent, current_tracestate);
        let call = (|| -> Result<_, Failure> {
            let request = EnqueueRequest::read(request, "request")
                .map_err(|e| e.into_failure(|message| Rejection::InvalidRequest { message }))?;
            Ok((self.core()?, with_trace(request.into_core(), &current)))
        })();
        settle_with(
            env,
            move |answer| {
                let (client, request) = match call {
                    Ok((client, Ok(request))) => (client, request),
                    Ok((_, Err(rejection))) => return answer(Err(rejection.into())),
                    Err(failure) => return answer(Err(failure)),
                };
                match runtime() {
                    Ok(rt) => {
                        // A promise cannot be cancelled: the handle is not needed.
                        let _ = client.enqueue_with(&rt, request, move |r| {
                            answer(r.map_err(Failure::from));
                        });
                    }
                    Err(failure) => answer(Err(failure)),
                }
            },
            EnqueueAck::from,
        )
    }

    /// Enqueues each job on its own (one round trip): one result per request, in order. A
    /// job that fails the checks of `enqueue` (a value that cannot be held included) is not
    /// sent and gets `status: 'rejected'` in its slot; the others are committed together.
    ///
    /// Rejects with `InvalidArgumentError` for an empty batch or one larger than the server's
    /// `maxEnqueueBatch`, a `TypeError` for a mistyped request; otherwise as `enqueue` for the
    /// call as a whole.
    #[napi(
        ts_args_type = "requests: EnqueueRequest[]",
        ts_return_type = "Promise<EnqueueResult[]>"
    )]
    pub fn enqueue_batch<'env>(
        &self,
        env: &'env Env,
        requests: Option<Unknown<'env>>,
        // Not in the declarations: sepp.js passes the caller's current trace context here.
        current_traceparent: Option<String>,
        current_tracestate: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, Vec<EnqueueResult>>> {
        let current = current(current_traceparent, current_tracestate);
        let call = core_requests(requests).and_then(|r| {
            let r = r.into_iter().map(|r| with_trace(r, &current)).collect();
            Ok((self.core()?, r))
        });
        settle(
            env,
            async move {
                let (client, requests) = call?;
                Ok(client.enqueue_batch_prepared(requests).await?)
            },
            |results| results.into_iter().map(EnqueueResult::from).collect(),
        )
    }

    /// Enqueues all jobs or none: `status: 'committed'` with the acks in order, or
    /// `status: 'rejected'` with every failing job (nothing was written). Jobs failing the
    /// checks of `enqueue` fail the batch without a network call.
    ///
    /// Rejects as `enqueueBatch`.
    #[napi(
        ts_args_type = "requests: EnqueueRequest[]",
        ts_return_type = "Promise<AtomicResult>"
    )]
    pub fn enqueue_atomic<'env>(
        &self,
        env: &'env Env,
        requests: Option<Unknown<'env>>,
        // Not in the declarations: sepp.js passes the caller's current trace context here.
        current_traceparent: Option<String>,
        current_tracestate: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, AtomicResult>> {
        let current = current(current_traceparent, current_tracestate);
        let call = core_requests(requests).and_then(|r| {
            let r = r.into_iter().map(|r| with_trace(r, &current)).collect();
            Ok((self.core()?, r))
        });
        settle(
            env,
            async move {
                let (client, requests) = call?;
                Ok(client.enqueue_atomic_prepared(requests).await?)
            },
            AtomicResult::from,
        )
    }

    /// Leases up to `maxJobs` ready jobs from `queues` (in order), waiting up to
    /// `waitTimeoutMs` for the first; resolves to an empty array when none came. Never
    /// retried automatically: a lost reply would lease jobs twice.
    ///
    /// Rejects with `InvalidArgumentError` before sending (no queues, a lease that is not
    /// positive, `maxJobs` 0, a negative duration), `FailedPreconditionError` when the server is
    /// in strict mode and a queue is not declared, or as `enqueue` for the call.
    #[napi(
        ts_args_type = "options: ReserveOptions",
        ts_return_type = "Promise<Job[]>"
    )]
    pub fn reserve<'env>(
        &self,
        env: &'env Env,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Vec<Job>>> {
        let call = (|| -> Result<_, Failure> {
            let options = ReserveOptions::read(options)
                .and_then(|o| o.into_core().map_err(BadInput::Value))
                .map_err(|e| e.into_failure(ReserveError::Invalid))?;
            Ok((self.core()?, options))
        })();
        settle(
            env,
            async move {
                let (client, options) = call?;
                Ok(client.reserve(options).await?)
            },
            |jobs| jobs.into_iter().map(Job::from).collect(),
        )
    }

    /// Acks delivery `attempt` of job `jobId`: the job is done and removed.
    ///
    /// Rejects with `JobNotInFlightError` when the job is not in flight (acked already, lease
    /// expired, dead-lettered, never existed) and `AttemptMismatchError` when it was redelivered
    /// under another attempt: either way the lease is lost. `InvalidArgumentError` for an
    /// `attempt` that is not a non-negative integer; otherwise as `enqueue` for the call.
    #[napi(
        ts_args_type = "jobId: string, attempt: number",
        ts_return_type = "Promise<void>"
    )]
    pub fn ack<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let call = (|| -> Result<_, Failure> {
            let (job_id, attempt) =
                delivery(job_id, attempt).map_err(|e| e.into_failure(LeaseError::Invalid))?;
            Ok((self.core()?, job_id, attempt))
        })();
        settle(
            env,
            async move {
                let (client, job_id, attempt) = call?;
                Ok(client.ack(&job_id, attempt).await?)
            },
            |()| (),
        )
    }

    /// Acks delivery `attempt` of job `jobId` and, in the same call, leases up to
    /// `next.maxJobs` ready jobs from `next.queues` (without waiting: `next.waitTimeoutMs` must
    /// be unset or 0): a worker's ack that brings its next job. A sepp server commits the ack
    /// and the new leases together. The worker (`Worker`) acks this way already.
    ///
    /// Resolves to the jobs leased (empty when none was ready: reserve with a wait), or to
    /// `null` when the server leased nothing for the call (a server without this extension,
    /// such as the public sepp 0.1.1, or a lease that failed after the ack took): reserve on
    /// your own. Either way the job was acked. Retried as `ack` is; a retry after the first try
    /// took is refused (`JobNotInFlightError`) and leases nothing.
    ///
    /// Rejects as `ack` (then nothing was leased), or with `InvalidArgumentError` for `next`
    /// as `reserve` checks it (then nothing was acked).
    #[napi(
        ts_args_type = "jobId: string, attempt: number, next: ReserveOptions",
        ts_return_type = "Promise<Job[] | null>"
    )]
    pub fn ack_then_reserve<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
        next: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Option<Vec<Job>>>> {
        let call = (|| -> Result<_, Failure> {
            let (job_id, attempt) =
                delivery(job_id, attempt).map_err(|e| e.into_failure(LeaseError::Invalid))?;
            let next = ReserveOptions::read(next)
                .and_then(|o| o.into_core().map_err(BadInput::Value))
                .map_err(|e| e.into_failure(LeaseError::Invalid))?;
            Ok((self.core()?, job_id, attempt, next))
        })();
        settle(
            env,
            async move {
                let (client, job_id, attempt, next) = call?;
                Ok(client.ack_then_reserve(&job_id, attempt, next).await?)
            },
            |jobs| jobs.map(|jobs| jobs.into_iter().map(Job::from).collect()),
        )
    }

    /// Nacks delivery `attempt` of job `jobId`: retries it per `options.retry`, or
    /// dead-letters it. Resolves to `true` when the job was dead-lettered (`'deadLetter'`,
    /// or its last attempt).
    ///
    /// Rejects as `ack`; `InvalidArgumentError` also for a negative `delayMs`.
    #[napi(
        ts_args_type = "jobId: string, attempt: number, options?: NackOptions",
        ts_return_type = "Promise<boolean>"
    )]
    pub fn nack<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, bool>> {
        let call = (|| -> Result<_, Failure> {
            let (job_id, attempt, options) = delivery(job_id, attempt)
                .and_then(|(j, a)| Ok((j, a, NackOptions::read(options)?)))
                .map_err(|e| e.into_failure(LeaseError::Invalid))?;
            let retry = options.core_retry().map_err(LeaseError::Invalid)?;
            Ok((self.core()?, job_id, attempt, retry, options.reason))
        })();
        settle(
            env,
            async move {
                let (client, job_id, attempt, retry, reason) = call?;
                Ok(client.nack(&job_id, attempt, retry, reason).await?)
            },
            |dead_lettered| dead_lettered,
        )
    }

    /// Extends the lease of delivery `attempt` of job `jobId` to now + `leaseDurationMs`
    /// milliseconds (clamped by the server). Resolves to the new expiry. Does not add an
    /// attempt; may be called any number of times.
    ///
    /// Rejects with `InvalidArgumentError` for a duration that is not positive; otherwise as `ack`.
    #[napi(
        ts_args_type = "jobId: string, attempt: number, leaseDurationMs: number",
        ts_return_type = "Promise<Date>"
    )]
    pub fn extend<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
        attempt: Option<Unknown<'env>>,
        lease_duration_ms: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Date>> {
        let call = (|| -> Result<_, Failure> {
            let (job_id, attempt, lease) = delivery(job_id, attempt)
                .and_then(|(j, a)| {
                    let ms = read::number(lease_duration_ms, "leaseDurationMs")?;
                    let lease = value::duration("leaseDurationMs", ms).map_err(BadInput::Value)?;
                    Ok((j, a, lease))
                })
                .map_err(|e| e.into_failure(LeaseError::Invalid))?;
            Ok((self.core()?, job_id, attempt, lease))
        })();
        settle(
            env,
            async move {
                let (client, job_id, attempt, lease) = call?;
                Ok(client.extend(&job_id, attempt, lease).await?)
            },
            Date::from,
        )
    }

    /// Removes and returns up to `max` dead-letter records, oldest first, of one queue or of
    /// all. Destructive, and never retried automatically. Empty unless the server keeps dead
    /// letters (`deadLetterRetentionEnabled`).
    ///
    /// Rejects with `InvalidArgumentError` for `max` 0 or not an integer; otherwise as `reserve`.
    #[napi(
        ts_args_type = "options: DrainDeadLettersOptions",
        ts_return_type = "Promise<DeadLetterRecord[]>"
    )]
    pub fn drain_dead_letters<'env>(
        &self,
        env: &'env Env,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Vec<DeadLetterRecord>>> {
        let call = (|| -> Result<_, Failure> {
            let (queue, max) = DrainDeadLettersOptions::read(options)
                .and_then(|o| {
                    let max = value::uint32("options.max", o.max).map_err(BadInput::Value)?;
                    Ok((o.queue, max))
                })
                .map_err(|e| e.into_failure(ReserveError::Invalid))?;
            Ok((self.core()?, queue, max))
        })();
        settle(
            env,
            async move {
                let (client, queue, max) = call?;
                Ok(client.drain_dead_letters(queue.as_deref(), max).await?)
            },
            |records| records.into_iter().map(DeadLetterRecord::from).collect(),
        )
    }

    /// The server's version and limits. Also refreshes the limits this client checks
    /// requests against.
    ///
    /// Rejects with `TransportError`, `UnauthenticatedError`, `OverloadedError` or `ServerFaultError`.
    #[napi(ts_return_type = "Promise<ServerInfo>")]
    pub fn get_server_info<'env>(
        &self,
        env: &'env Env,
    ) -> napi::Result<PromiseRaw<'env, ServerInfo>> {
        let client = self.core();
        settle(
            env,
            async move { Ok(client?.get_server_info().await?) },
            ServerInfo::from,
        )
    }
}

/// The addon's tokio runtime, for [`sepp_rs::SeppClient::enqueue_with`]. napi keeps the runtime
/// to itself (it may stop it when the last environment goes and start another), so its handle
/// is asked for on each call rather than kept.
fn runtime() -> Result<napi::tokio::runtime::Handle, Failure> {
    napi::bindgen_prelude::within_runtime_if_available(napi::tokio::runtime::Handle::try_current)
        .map_err(|_| {
            Failure::Sepp(SeppFailure::new(
                ErrorCode::Transport,
                "the addon's async runtime is not running",
            ))
        })
}
