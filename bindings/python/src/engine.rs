//! The core's worker engine for the Python `Worker`: [`EngineOptions`], [`Engine`], the
//! [`Lease`] it hands out, the [`Outcome`] reported back and the run's [`WorkerReport`].
//!
//! Conversion only. Every rule of a worker (reserve batching, lease keeping and loss, the
//! job types without a handler, the handler timeout, shutdown and abandon-on-drop, the
//! counts) is `sepp_rs::engine`'s; `sepp.worker` only runs the handler of each job and turns
//! its result into an `Outcome`.

use crate::call::{ToPython, coroutine};
use crate::client::SeppClient;
use crate::error::{Failure, Invalid, warn_deprecated};
use crate::job::Job;
use crate::repr::repr;
use crate::request::{names_arg, opt_bool_arg, opt_names_arg, opt_str_arg, u32_arg};
use crate::time::{duration_arg, opt_datetime_to_py};
use futures_util::FutureExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sepp_rs::engine::{self, Outcome as CoreOutcome};
use std::time::Duration;

/// How an engine reserves and keeps leases; arguments are converted (and their types checked)
/// when constructed, the values by `Engine.start`.
#[pyclass(module = "sepp._native", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EngineOptions {
    /// The core's options.
    inner: engine::EngineOptions,
}

#[pymethods]
impl EngineOptions {
    #[new]
    #[pyo3(signature = (queues, *, lease_duration=None, max_in_flight=None, auto_extend=None, wait_timeout=None, max_backoff=None, worker_id=None, job_types=None, handler_timeout=None, shutdown_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        queues: &Bound<'_, PyAny>,
        lease_duration: Option<&Bound<'_, PyAny>>,
        max_in_flight: Option<&Bound<'_, PyAny>>,
        auto_extend: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        max_backoff: Option<&Bound<'_, PyAny>>,
        worker_id: Option<&Bound<'_, PyAny>>,
        job_types: Option<&Bound<'_, PyAny>>,
        handler_timeout: Option<&Bound<'_, PyAny>>,
        shutdown_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut inner = engine::EngineOptions::new(names_arg(queues, "queues")?);
        let duration = |obj: Option<&Bound<'_, PyAny>>, name: &str, default: Duration| match obj {
            Some(o) if !o.is_none() => duration_arg(o, name, Invalid::Argument),
            _ => Ok(default),
        };
        inner.lease_duration = duration(lease_duration, "lease_duration", inner.lease_duration)?;
        inner.wait_timeout = duration(wait_timeout, "wait_timeout", inner.wait_timeout)?;
        inner.max_backoff = duration(max_backoff, "max_backoff", inner.max_backoff)?;
        inner.shutdown_timeout =
            duration(shutdown_timeout, "shutdown_timeout", inner.shutdown_timeout)?;
        inner.handler_timeout = match handler_timeout {
            Some(o) if !o.is_none() => Some(duration_arg(o, "handler_timeout", Invalid::Argument)?),
            _ => None,
        };
        inner.job_types = opt_names_arg(job_types, "job_types")?;
        if let Some(n) = max_in_flight.filter(|o| !o.is_none()) {
            inner.max_in_flight = u32_arg(n, "max_in_flight", Invalid::Argument)? as usize;
        }
        if let Some(on) = opt_bool_arg(auto_extend, "auto_extend")? {
            inner.auto_extend = on;
        }
        inner.worker_id = opt_str_arg(worker_id, "worker_id")?;
        // What the engine needs of them, checked here so that a Worker refuses them when it is
        // made (the core's rule, as Engine.start applies it).
        inner
            .check()
            .map_err(|e| Failure::from(e).into_pyerr(queues.py()))?;
        Ok(EngineOptions { inner })
    }

    #[getter]
    fn queues(&self) -> Vec<String> {
        self.inner.queues.clone()
    }

    #[getter]
    fn lease_duration(&self) -> Duration {
        self.inner.lease_duration
    }

    #[getter]
    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight
    }

    #[getter]
    fn auto_extend(&self) -> bool {
        self.inner.auto_extend
    }

    #[getter]
    fn wait_timeout(&self) -> Duration {
        self.inner.wait_timeout
    }

    #[getter]
    fn max_backoff(&self) -> Duration {
        self.inner.max_backoff
    }

    #[getter]
    fn worker_id(&self) -> Option<String> {
        self.inner.worker_id.clone()
    }

    #[getter]
    fn job_types(&self) -> Option<Vec<String>> {
        self.inner.job_types.clone()
    }

    #[getter]
    fn handler_timeout(&self) -> Option<Duration> {
        self.inner.handler_timeout
    }

    #[getter]
    fn shutdown_timeout(&self) -> Duration {
        self.inner.shutdown_timeout
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "EngineOptions({}, lease_duration={}, max_in_flight={}, auto_extend={})",
            repr(py, self.inner.queues.clone()),
            repr(py, self.inner.lease_duration),
            self.inner.max_in_flight,
            repr(py, self.inner.auto_extend)
        )
    }
}

/// What became of a job, as reported to `Engine.settle`.
#[pyclass(module = "sepp._native", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    /// The core's outcome.
    inner: CoreOutcome,
}

#[pymethods]
impl Outcome {
    #[staticmethod]
    fn success() -> Self {
        Outcome {
            inner: CoreOutcome::Success,
        }
    }

    #[staticmethod]
    #[pyo3(signature = (reason=None))]
    fn retry(reason: Option<String>) -> Self {
        Outcome {
            inner: CoreOutcome::Retry { reason },
        }
    }

    #[staticmethod]
    #[pyo3(signature = (delay, reason=None))]
    fn retry_after(delay: &Bound<'_, PyAny>, reason: Option<String>) -> PyResult<Self> {
        Ok(Outcome {
            inner: CoreOutcome::RetryAfter {
                delay: duration_arg(delay, "delay", Invalid::Argument)?,
                reason,
            },
        })
    }

    #[staticmethod]
    #[pyo3(signature = (reason=None))]
    fn permanent(reason: Option<String>) -> Self {
        Outcome {
            inner: CoreOutcome::Permanent { reason },
        }
    }

    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            CoreOutcome::Success => "success",
            CoreOutcome::Retry { .. } => "retry",
            CoreOutcome::RetryAfter { .. } => "retry_after",
            CoreOutcome::Permanent { .. } => "permanent",
        }
    }

    #[getter]
    fn delay(&self) -> Option<Duration> {
        match self.inner {
            CoreOutcome::RetryAfter { delay, .. } => Some(delay),
            _ => None,
        }
    }

    #[getter]
    fn reason(&self) -> Option<String> {
        match &self.inner {
            CoreOutcome::Success => None,
            CoreOutcome::Retry { reason }
            | CoreOutcome::RetryAfter { reason, .. }
            | CoreOutcome::Permanent { reason } => reason.clone(),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let reason = self
            .reason()
            .map(|r| format!("reason={}", repr(py, r)))
            .unwrap_or_default();
        match self.inner {
            CoreOutcome::Success => "Outcome.success()".into(),
            CoreOutcome::RetryAfter { delay, .. } => {
                let sep = if reason.is_empty() { "" } else { ", " };
                format!("Outcome.retry_after({}{sep}{reason})", repr(py, delay))
            }
            _ => format!("Outcome.{}({reason})", self.kind()),
        }
    }
}

/// A job handed out by `Engine.next`, with its lease.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct Lease {
    /// The job, converted once.
    job: Py<Job>,
    /// The core's lease: the lost signal and the current expiry.
    inner: engine::Lease,
}

#[pymethods]
impl Lease {
    #[getter]
    fn job(&self, py: Python<'_>) -> Py<Job> {
        self.job.clone_ref(py)
    }

    #[getter]
    fn expires_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.inner.expires_at())
    }

    #[getter]
    fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// The span the job's handler runs in, by the core's rule (`sepp_rs::trace`): its name,
    /// its attributes, and its parent `(traceparent, tracestate)` when the job carries a valid
    /// one.
    #[allow(clippy::type_complexity)] // a plain tuple is what Python receives
    fn handler_span(
        &self,
    ) -> (
        &'static str,
        Vec<(&'static str, String)>,
        Option<(String, Option<String>)>,
    ) {
        let s = sepp_rs::trace::handler_span(&self.inner.job);
        (
            s.name,
            s.attributes,
            s.parent.map(|t| (t.traceparent, t.tracestate)),
        )
    }

    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lease = self.inner.clone();
        coroutine(py, async move {
            lease.lost().await;
            Ok::<(), Failure>(())
        })
    }

    fn ended<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lease = self.inner.clone();
        coroutine(py, async move { Ok::<_, Failure>(lease.ended().await) })
    }

    fn done<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lease = self.inner.clone();
        coroutine(py, async move {
            Ok::<_, Failure>(lease.done().await.as_str().to_string())
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let job = self.job.get();
        format!(
            "Lease(job_id={}, attempt={}, lost={})",
            repr(py, job.id()),
            job.attempt(),
            repr(py, self.inner.is_lost())
        )
    }
}

impl ToPython for engine::Lease {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let job = Py::new(py, Job::from_core(py, self.job.clone())?)?;
        Ok(Bound::new(py, Lease { job, inner: self })?.into_any())
    }
}

/// The result of a task spawned on the runtime; `Err` holds why it did not finish (a panic in
/// the core), raised as `RuntimeError`.
struct Detached<T>(Result<T, String>);

impl<T: ToPython> ToPython for Detached<T> {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self.0 {
            Ok(t) => t.to_python(py),
            Err(e) => Err(PyRuntimeError::new_err(format!(
                "sepp engine task failed: {e}"
            ))),
        }
    }
}

/// The core's engine: reserves for free slots, keeps leases, settles what the host reports.
//
// The poller and the lease extenders run on the runtime, apart from this object. When the last
// handle is garbage-collected without a drain (a worker task dropped mid-run), the core nacks
// what is still held, so no job stays leased by an engine nobody can reach.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct Engine {
    inner: engine::Engine,
}

#[pymethods]
impl Engine {
    #[staticmethod]
    fn start(
        py: Python<'_>,
        client: PyRef<'_, SeppClient>,
        options: PyRef<'_, EngineOptions>,
    ) -> PyResult<Self> {
        let client = client.core()?;
        // The core spawns its poller on the runtime that runs every call of this module.
        let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
        engine::Engine::start(client, options.inner.clone())
            .map(|inner| Engine { inner })
            .map_err(|e| Failure::from(e).into_pyerr(py))
    }

    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.inner.clone();
        coroutine(py, async move { Ok::<_, Failure>(engine.next().await) })
    }

    fn next_batch<'py>(
        &self,
        py: Python<'py>,
        max_leases: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.inner.clone();
        let max = u32_arg(max_leases, "max_leases", Invalid::Argument)?.max(1) as usize;
        coroutine(py, async move {
            let Some(first) = engine.next().await else {
                return Ok::<_, Failure>(Vec::new());
            };
            let mut leases = vec![first];
            // Then the leases already waiting, without waiting for more: one hand-over to the
            // event loop for a whole reserved batch. `next` is cancel-safe (a channel receive),
            // so a poll that finds nothing loses nothing.
            while leases.len() < max {
                match engine.next().now_or_never() {
                    Some(Some(lease)) => leases.push(lease),
                    _ => break,
                }
            }
            Ok(leases)
        })
    }

    fn settle<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
        outcome: PyRef<'py, Outcome>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let attempt = u32_arg(attempt, "attempt", Invalid::Argument)?;
        let outcome = outcome.inner.clone();
        // Called here, not in the coroutine: the engine lets go of the job before this returns,
        // so a stop that begins before the coroutine runs does not count it as running.
        let call = self.inner.settle(&job_id, attempt, outcome);
        coroutine(py, async move {
            // Settling runs to the end on the runtime even when the awaiting task is
            // cancelled: dropped half way, the job would leave the engine unsettled.
            let settle = pyo3_async_runtimes::tokio::get_runtime().spawn(call);
            match settle.await {
                Ok(r) => r.map(|()| Detached(Ok(()))).map_err(Failure::from),
                Err(e) => Ok(Detached(Err(e.to_string()))),
            }
        })
    }

    fn complete<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
        outcome: PyRef<'py, Outcome>,
    ) -> PyResult<Bound<'py, PyAny>> {
        warn_deprecated(py, "Engine.complete is deprecated: use Engine.settle")?;
        self.settle(py, job_id, attempt, outcome)
    }

    fn shutdown(&self) {
        // Shutting down spawns the release of the jobs not handed out yet.
        let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
        self.inner.shutdown();
    }

    #[getter]
    fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }

    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// What a worker tells its user as a stop begins with jobs still held; `None` when none is.
    fn stop_notice(&self) -> Option<String> {
        self.inner.stop_notice()
    }

    /// Why the engine stopped by itself (the server refused a reserve for good), as the
    /// exception a call would raise; `None` otherwise.
    fn failure(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner
            .failure()
            .map(|e| Failure::from(e).into_pyerr(py).into_value(py).into_any())
    }

    fn wait_idle<'py>(
        &self,
        py: Python<'py>,
        timeout: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.inner.clone();
        let timeout = duration_arg(timeout, "timeout", Invalid::Argument)?;
        coroutine(py, async move {
            Ok::<_, Failure>(engine.wait_idle(timeout).await)
        })
    }

    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.inner.clone();
        coroutine(py, async move {
            // Like `settle`, not cut short by a cancelled task.
            let drain = pyo3_async_runtimes::tokio::get_runtime()
                .spawn(async move { engine.drain().await });
            Ok::<_, Failure>(Detached(drain.await.map_err(|e| e.to_string())))
        })
    }

    fn end_grace_period(&self) {
        self.inner.end_grace_period();
    }

    #[getter]
    fn report(&self) -> WorkerReport {
        WorkerReport::from(self.inner.report())
    }

    fn abandon_all<'py>(&self, py: Python<'py>, reason: String) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.inner.clone();
        coroutine(py, async move {
            // Like `complete`, the nacks are not cut short by a cancelled task.
            let abandon = pyo3_async_runtimes::tokio::get_runtime()
                .spawn(async move { engine.abandon_all(&reason).await });
            Ok::<_, Failure>(Detached(abandon.await.map_err(|e| e.to_string())))
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<Engine in_flight={} shut_down={}>",
            self.inner.in_flight(),
            self.inner.is_shut_down()
        )
    }
}

/// What a worker run did: counts of jobs, kept by the core's engine.
#[pyclass(module = "sepp._native", frozen, eq, get_all)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkerReport {
    acked: u64,
    nacked: u64,
    lease_lost: u64,
    abandoned: u64,
}

impl From<engine::WorkerReport> for WorkerReport {
    fn from(r: engine::WorkerReport) -> Self {
        let engine::WorkerReport {
            acked,
            nacked,
            lease_lost,
            abandoned,
        } = r;
        WorkerReport {
            acked,
            nacked,
            lease_lost,
            abandoned,
        }
    }
}

#[pymethods]
impl WorkerReport {
    #[new]
    #[pyo3(signature = (*, acked=0, nacked=0, lease_lost=0, abandoned=0))]
    fn new(acked: u64, nacked: u64, lease_lost: u64, abandoned: u64) -> Self {
        WorkerReport {
            acked,
            nacked,
            lease_lost,
            abandoned,
        }
    }

    #[getter]
    fn succeeded(&self, py: Python<'_>) -> PyResult<u64> {
        warn_deprecated(
            py,
            "WorkerReport.succeeded is deprecated: use WorkerReport.acked",
        )?;
        Ok(self.acked)
    }

    #[getter]
    fn failed(&self, py: Python<'_>) -> PyResult<u64> {
        warn_deprecated(
            py,
            "WorkerReport.failed is deprecated: use WorkerReport.nacked",
        )?;
        Ok(self.nacked)
    }

    fn __repr__(&self) -> String {
        format!(
            "WorkerReport(acked={}, nacked={}, lease_lost={}, abandoned={})",
            self.acked, self.nacked, self.lease_lost, self.abandoned
        )
    }
}
