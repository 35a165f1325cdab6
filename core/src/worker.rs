//! [`Worker`]: runs async handlers on leased jobs, over the [`Engine`].
//!
//! Handlers are registered per job type, plus an optional catch-all. Each job runs in its own
//! tokio task, at most `max_in_flight` at once. A handler returns `Ok(())` (ack) or a
//! [`HandlerError`]: [`HandlerError::retry`] (the queue's retry policy),
//! [`HandlerError::retry_after`] (a delay), [`HandlerError::permanent`] (dead-letter). A
//! panicking handler is nacked with the retry policy; the worker goes on.
//!
//! The worker only runs handlers: the policy around them is the engine's, shared with the
//! Python and Node workers ([`crate::engine`]): a job type without a handler is nacked
//! there, a lost lease frees its slot without a call, a handler past `handler_timeout` is
//! nacked, and shutdown (stop reserving, `shutdown_timeout` for running handlers, then nack
//! the rest) is the engine's `drain`. Whenever the engine lets go of a job before its handler
//! returns, the handler is cancelled (dropped at its next await point).

use crate::client::SeppClient;
pub use crate::engine::WorkerReport;
use crate::engine::{Engine, EngineOptions, Lease, Outcome};
use crate::error::LeaseError;
use crate::job::Job;
use futures_util::FutureExt;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::task::JoinSet;

/// Why a handler failed, and what to do with the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    outcome: Outcome,
}

impl HandlerError {
    /// Retry with the queue's policy (`retry_delay_ms`, `retry_backoff`); dead-lettered on the
    /// last attempt.
    pub fn retry() -> Self {
        HandlerError {
            outcome: Outcome::Retry { reason: None },
        }
    }

    /// Retry after `delay`; dead-lettered on the last attempt.
    pub fn retry_after(delay: Duration) -> Self {
        HandlerError {
            outcome: Outcome::RetryAfter {
                delay,
                reason: None,
            },
        }
    }

    /// Do not retry: dead-letter the job now.
    pub fn permanent() -> Self {
        HandlerError {
            outcome: Outcome::Permanent { reason: None },
        }
    }

    /// Attaches a reason, kept as the job's last nack reason.
    #[must_use]
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        let r = Some(reason.into());
        match &mut self.outcome {
            Outcome::Retry { reason }
            | Outcome::RetryAfter { reason, .. }
            | Outcome::Permanent { reason } => *reason = r,
            Outcome::Success => {}
        }
        self
    }

    /// The outcome this error reports to the engine.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Outcome::Retry { reason } => {
                write!(f, "retry ({})", reason.as_deref().unwrap_or("no reason"))
            }
            Outcome::RetryAfter { delay, reason } => {
                write!(
                    f,
                    "retry after {delay:?} ({})",
                    reason.as_deref().unwrap_or("no reason")
                )
            }
            Outcome::Permanent { reason } => {
                write!(
                    f,
                    "permanent failure ({})",
                    reason.as_deref().unwrap_or("no reason")
                )
            }
            Outcome::Success => f.write_str("success"),
        }
    }
}

/// Any error converts into a retry with its message as the reason, so handlers can use `?`.
impl<E: std::error::Error> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry().with_reason(e.to_string())
    }
}

/// What a handler gets: the job and its lease.
#[derive(Debug, Clone)]
pub struct JobCtx {
    lease: Lease,
}

impl JobCtx {
    /// The job.
    pub fn job(&self) -> &Job {
        &self.lease.job
    }

    /// Which delivery this is (1-based).
    pub fn attempt(&self) -> u32 {
        self.lease.job.attempt
    }

    /// The current lease expiry (moved by auto-extension).
    pub fn lease_expires_at(&self) -> Option<SystemTime> {
        self.lease.expires_at()
    }

    /// Resolves when the lease is lost; the worker also cancels the handler then.
    pub async fn lease_lost(&self) {
        self.lease.lost().await;
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;
type Handler = Arc<dyn Fn(JobCtx) -> BoxFuture + Send + Sync>;

/// Settings of a [`Worker`]; start from [`Worker::builder`].
pub struct WorkerBuilder {
    client: SeppClient,
    opts: EngineOptions,
    handlers: HashMap<String, Handler>,
    fallback: Option<Handler>,
}

impl WorkerBuilder {
    /// Lease per job (default 30 s).
    #[must_use]
    pub fn lease_duration(mut self, d: Duration) -> Self {
        self.opts.lease_duration = d;
        self
    }

    /// Most jobs processed at once (default 10).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.opts.max_in_flight = n;
        self
    }

    /// Extend leases while handlers run (default true).
    #[must_use]
    pub fn auto_extend(mut self, on: bool) -> Self {
        self.opts.auto_extend = on;
        self
    }

    /// Long-poll wait per Reserve (default 5 s).
    #[must_use]
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.opts.wait_timeout = d;
        self
    }

    /// Label for the leases (shown by job inspection).
    #[must_use]
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.opts.worker_id = Some(id.into());
        self
    }

    /// How long in-flight handlers may run after shutdown begins (default 30 s).
    #[must_use]
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.opts.shutdown_timeout = d;
        self
    }

    /// Longest a handler may run on one job (default: no limit). Past it the handler is
    /// cancelled and the job nacked with the queue's retry policy and a reason saying so.
    #[must_use]
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.opts.handler_timeout = Some(d);
        self
    }

    /// Handles jobs of `job_type` with `f`.
    #[must_use]
    pub fn handle<F, Fut>(mut self, job_type: impl Into<String>, f: F) -> Self
    where
        F: Fn(JobCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handlers
            .insert(job_type.into(), Arc::new(move |ctx| Box::pin(f(ctx))));
        self
    }

    /// Handles every job type without its own handler.
    #[must_use]
    pub fn fallback<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(JobCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.fallback = Some(Arc::new(move |ctx| Box::pin(f(ctx))));
        self
    }

    /// The worker; it starts reserving when run.
    pub fn build(self) -> Worker {
        let mut opts = self.opts;
        // Without a catch-all, the engine nacks the types nobody handles.
        if self.fallback.is_none() {
            opts.job_types = Some(self.handlers.keys().cloned().collect());
        }
        Worker {
            client: self.client,
            opts,
            handlers: Arc::new(self.handlers),
            fallback: self.fallback,
        }
    }
}

/// Processes jobs with registered handlers.
pub struct Worker {
    client: SeppClient,
    opts: EngineOptions,
    handlers: Arc<HashMap<String, Handler>>,
    fallback: Option<Handler>,
}

impl Worker {
    /// A worker reserving from `queues` through `client`.
    pub fn builder<I, S>(client: SeppClient, queues: I) -> WorkerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        WorkerBuilder {
            client,
            opts: EngineOptions::new(queues),
            handlers: HashMap::new(),
            fallback: None,
        }
    }

    /// Runs until SIGTERM or Ctrl-C, then shuts down gracefully.
    ///
    /// # Errors
    /// As [`Worker::run_until`].
    pub async fn run(self) -> Result<WorkerReport, LeaseError> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `shutdown` resolves, then stops reserving, lets in-flight handlers finish
    /// within `shutdown_timeout`, cancels the rest and nacks their jobs.
    ///
    /// # Errors
    /// [`LeaseError::Invalid`] for bad options (no queues, zero lease, zero concurrency, zero
    /// handler timeout); [`LeaseError::Client`] when the server refused to reserve for good
    /// ([`Engine::failure`]), after the jobs already running were drained.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerReport, LeaseError> {
        tokio::pin!(shutdown);
        self.opts.check()?;
        // A stop asked for already starts no engine: it would lease jobs only to give them
        // back, each at the cost of an attempt.
        if (&mut shutdown).now_or_never().is_some() {
            return Ok(WorkerReport::default());
        }
        let engine = Engine::start(self.client.clone(), self.opts.clone())?;
        let mut tasks: JoinSet<()> = JoinSet::new();
        loop {
            tokio::select! {
                lease = engine.next() => {
                    let Some(lease) = lease else { break };
                    if let Some(handler) = self.handler_for(&lease.job) {
                        tasks.spawn(run_one(engine.clone(), handler, lease));
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = &mut shutdown => break,
            }
        }
        // Every job still held ends here (settled, or nacked by the drain), and each task
        // returns once its job has ended.
        if let Some(notice) = engine.stop_notice() {
            tracing::info!("{notice}");
        }
        engine.drain().await;
        while tasks.join_next().await.is_some() {}
        match engine.failure() {
            Some(e) => Err(LeaseError::Client(e)),
            None => Ok(engine.report()),
        }
    }

    fn handler_for(&self, job: &Job) -> Option<Handler> {
        self.handlers
            .get(&job.job_type)
            .cloned()
            .or_else(|| self.fallback.clone())
    }
}

/// Runs one handler and reports how it ended; a panic is a retry. When the engine lets go of
/// the job first (lease lost, handler timeout, shutdown), the handler is dropped.
async fn run_one(engine: Engine, handler: Handler, lease: Lease) {
    let ctx = JobCtx {
        lease: lease.clone(),
    };
    // The handler runs inside its span, a child of the job's trace context (crate::trace).
    #[cfg(feature = "opentelemetry")]
    let span_cx = crate::trace::otel::handler_context(&lease.job);
    #[cfg(feature = "opentelemetry")]
    let run = AssertUnwindSafe(opentelemetry::context::FutureExt::with_context(
        handler(ctx),
        span_cx.clone(),
    ))
    .catch_unwind();
    #[cfg(not(feature = "opentelemetry"))]
    let run = AssertUnwindSafe(handler(ctx)).catch_unwind();
    let outcome = tokio::select! {
        r = run => match r {
            Ok(Ok(())) => Outcome::Success,
            Ok(Err(e)) => e.outcome,
            Err(panic) => Outcome::Retry {
                reason: Some(format!("handler panicked: {}", panic_message(&panic))),
            },
        },
        _ = lease.done() => return,
    };
    #[cfg(feature = "opentelemetry")]
    {
        use opentelemetry::trace::TraceContextExt;
        match &outcome {
            Outcome::Success => {}
            Outcome::Retry { reason }
            | Outcome::RetryAfter { reason, .. }
            | Outcome::Permanent { reason } => {
                crate::trace::otel::failed(&span_cx, reason.as_deref().unwrap_or("failed"));
            }
        }
        span_cx.span().end();
    }
    // The engine counts and logs the result, whatever it is.
    let _ = engine
        .settle(&lease.job.id, lease.job.attempt, outcome)
        .await;
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
