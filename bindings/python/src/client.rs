//! `SeppClient`: the core client behind a Python class whose async methods return coroutines.

use crate::call::{ToPython, callback_coroutine, coroutine};
use crate::error::{Failure, Invalid};
use crate::job::LeaseExpiry;
use crate::request::{
    EnqueueRequest, NackRetry, RetryPolicy, TlsOptions, class_arg, class_list_arg, names_arg,
    opt_bool_arg, opt_class_arg, opt_names_arg, opt_str_arg, opt_u32_arg, u32_arg,
};
use crate::time::{duration_arg, opt_duration_arg};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use sepp_rs::admin::DeadLetterSelector;
use sepp_rs::{EnqueueError, ReserveOptions};
use std::sync::RwLock;

/// An argument whose omission means something other than `None` (for `rpc_timeout`, `None`
/// means "no deadline" and omitting it means the core's default).
pub(crate) enum MaybeGiven<'py> {
    /// Not passed.
    Omitted,
    /// Passed, possibly as `None`.
    Given(Bound<'py, PyAny>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for MaybeGiven<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(MaybeGiven::Given(obj.to_owned()))
    }
}

/// A client of a sepp server: one connection shared by all its calls, usable from any task and
/// any thread's event loop. Use it with `async with`, or call `close`.
//
// Clones of the core client share the connection, so every call takes its own clone and `close`
// only drops this handle's: calls already running finish, and the connection closes with the
// last of them.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct SeppClient {
    /// `None` once closed. The lock is held only to clone or take the core client.
    inner: RwLock<Option<sepp_rs::SeppClient>>,
}

impl SeppClient {
    /// The core client, shared with this handle.
    ///
    /// # Errors
    /// `RuntimeError` once the client is closed.
    pub(crate) fn core(&self) -> PyResult<sepp_rs::SeppClient> {
        self.inner
            .read()
            .map_err(|_| PyRuntimeError::new_err("sepp client state poisoned"))?
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the sepp client is closed"))
    }

    fn take(&self) {
        if let Ok(mut g) = self.inner.write() {
            g.take();
        }
    }
}

/// The dead letters a requeue or delete applies to: `job_ids`, or the oldest `max` (default 1)
/// of `queue` (or of every queue).
fn dead_letter_selector(
    py: Python<'_>,
    job_ids: Option<Vec<String>>,
    queue: Option<String>,
    max: Option<&Bound<'_, PyAny>>,
) -> PyResult<DeadLetterSelector> {
    let max = opt_u32_arg(max, "max", Invalid::Argument)?;
    match job_ids {
        Some(_) if queue.is_some() || max.is_some() => Err(Invalid::Argument.err(
            py,
            "job_ids selects the dead letters by id: give it, or queue and max, not both",
        )),
        Some(ids) => Ok(DeadLetterSelector::Ids(ids)),
        None => Ok(DeadLetterSelector::Oldest {
            queue,
            max: max.unwrap_or(1),
        }),
    }
}

/// A freshly connected core client, wrapped when handed to Python.
struct Connected(sepp_rs::SeppClient);

impl ToPython for Connected {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let client = SeppClient {
            inner: RwLock::new(Some(self.0)),
        };
        Ok(Bound::new(py, client)?.into_any())
    }
}

/// The client itself, returned by `__aenter__`.
struct Myself(Py<SeppClient>);

impl ToPython for Myself {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(self.0.into_bound(py).into_any())
    }
}

#[pymethods]
impl SeppClient {
    #[staticmethod]
    #[pyo3(signature = (url, *, api_key=None, tls=None, rpc_timeout=MaybeGiven::Omitted, retry_policy=MaybeGiven::Omitted, coalesce=None, max_batches_in_flight=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect<'py>(
        py: Python<'py>,
        url: String,
        api_key: Option<&Bound<'py, PyAny>>,
        tls: Option<&Bound<'py, PyAny>>,
        rpc_timeout: MaybeGiven<'py>,
        retry_policy: MaybeGiven<'py>,
        coalesce: Option<&Bound<'py, PyAny>>,
        max_batches_in_flight: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut builder = sepp_rs::SeppClient::builder(url);
        if let Some(on) = opt_bool_arg(coalesce, "coalesce")? {
            builder = builder.coalesce(on);
        }
        if let Some(n) = opt_u32_arg(
            max_batches_in_flight,
            "max_batches_in_flight",
            Invalid::Config,
        )? {
            builder = builder.max_batches_in_flight(n as usize);
        }
        if let Some(key) = opt_str_arg(api_key, "api_key")? {
            builder = builder.api_key(key);
        }
        if let Some(tls) = opt_class_arg::<TlsOptions>(tls, "tls")? {
            builder = builder.tls(tls.borrow().inner.clone());
        }
        if let MaybeGiven::Given(t) = rpc_timeout {
            builder =
                builder.rpc_timeout(opt_duration_arg(Some(&t), "rpc_timeout", Invalid::Config)?);
        }
        // Left out: the core's default policy. `None`: no retries.
        if let MaybeGiven::Given(p) = retry_policy {
            builder = if p.is_none() {
                builder.no_retries()
            } else {
                builder.retry_policy(
                    class_arg::<RetryPolicy>(&p, "retry_policy")?
                        .borrow()
                        .inner
                        .clone(),
                )
            };
        }
        coroutine(py, async move {
            builder
                .connect()
                .await
                .map(Connected)
                .map_err(Failure::from)
        })
    }

    #[getter]
    fn max_idempotency_key_bytes(&self) -> PyResult<Option<u32>> {
        Ok(self.core()?.max_idempotency_key_bytes())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().map(|g| g.is_none()).unwrap_or(true)
    }

    fn enqueue<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = class_arg::<EnqueueRequest>(request, "request")?;
        let request = request.borrow();
        let client = self.core()?;
        let current = current_trace_context(py);
        let request = with_trace(request.prepared(), current.as_ref());
        callback_coroutine(py, move |deliver| {
            let request = match request {
                Ok(r) => r,
                Err(r) => {
                    deliver.result::<sepp_rs::EnqueueAck>(Err(Failure::from(
                        EnqueueError::Rejected(r),
                    )));
                    return Box::new(|| {});
                }
            };
            let runtime = pyo3_async_runtimes::tokio::get_runtime().handle();
            let handle = client.enqueue_with(runtime, request, move |r| {
                deliver.result(r.map_err(Failure::from));
            });
            Box::new(move || handle.cancel())
        })
    }

    fn enqueue_batch<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let requests = class_list_arg::<EnqueueRequest>(requests, "requests")?;
        let client = self.core()?;
        let current = current_trace_context(py);
        let requests: Vec<_> = requests
            .iter()
            .map(|r| with_trace(r.borrow().prepared(), current.as_ref()))
            .collect();
        coroutine(py, async move {
            client
                .enqueue_batch_prepared(requests)
                .await
                .map_err(Failure::from)
        })
    }

    fn enqueue_atomic<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let requests = class_list_arg::<EnqueueRequest>(requests, "requests")?;
        let client = self.core()?;
        let current = current_trace_context(py);
        let requests: Vec<_> = requests
            .iter()
            .map(|r| with_trace(r.borrow().prepared(), current.as_ref()))
            .collect();
        coroutine(py, async move {
            match client.enqueue_atomic_prepared(requests).await {
                Ok(Ok(acks)) => Ok(acks),
                Ok(Err(failures)) => Err(Failure::Rejected(failures)),
                Err(e) => Err(e.into()),
            }
        })
    }

    #[pyo3(signature = (queues, *, lease_duration, wait_timeout=None, max_jobs=None, worker_id=None))]
    fn reserve<'py>(
        &self,
        py: Python<'py>,
        queues: &Bound<'py, PyAny>,
        lease_duration: &Bound<'py, PyAny>,
        wait_timeout: Option<&Bound<'py, PyAny>>,
        max_jobs: Option<&Bound<'py, PyAny>>,
        worker_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let mut options = ReserveOptions::new(
            names_arg(queues, "queues")?,
            duration_arg(lease_duration, "lease_duration", Invalid::Argument)?,
        );
        options.wait_timeout = opt_duration_arg(wait_timeout, "wait_timeout", Invalid::Argument)?;
        options.max_jobs = opt_u32_arg(max_jobs, "max_jobs", Invalid::Argument)?;
        options.worker_id = opt_str_arg(worker_id, "worker_id")?;
        coroutine(py, async move {
            client.reserve(options).await.map_err(Failure::from)
        })
    }

    fn ack<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let attempt = u32_arg(attempt, "attempt", Invalid::Argument)?;
        coroutine(py, async move {
            client.ack(&job_id, attempt).await.map_err(Failure::from)
        })
    }

    #[pyo3(signature = (job_id, attempt, queues, *, lease_duration, max_jobs=None, worker_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn ack_then_reserve<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
        queues: &Bound<'py, PyAny>,
        lease_duration: &Bound<'py, PyAny>,
        max_jobs: Option<&Bound<'py, PyAny>>,
        worker_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let attempt = u32_arg(attempt, "attempt", Invalid::Argument)?;
        let mut next = ReserveOptions::new(
            names_arg(queues, "queues")?,
            duration_arg(lease_duration, "lease_duration", Invalid::Argument)?,
        );
        next.max_jobs = opt_u32_arg(max_jobs, "max_jobs", Invalid::Argument)?;
        next.worker_id = opt_str_arg(worker_id, "worker_id")?;
        coroutine(py, async move {
            client
                .ack_then_reserve(&job_id, attempt, next)
                .await
                .map_err(Failure::from)
        })
    }

    #[pyo3(signature = (job_id, attempt, *, retry=None, reason=None))]
    fn nack<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
        retry: Option<&Bound<'py, PyAny>>,
        reason: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let attempt = u32_arg(attempt, "attempt", Invalid::Argument)?;
        let retry = opt_class_arg::<NackRetry>(retry, "retry")?
            .map(|r| r.borrow().inner)
            .unwrap_or_default();
        let reason = opt_str_arg(reason, "reason")?;
        coroutine(py, async move {
            client
                .nack(&job_id, attempt, retry, reason)
                .await
                .map_err(Failure::from)
        })
    }

    fn extend<'py>(
        &self,
        py: Python<'py>,
        job_id: String,
        attempt: &Bound<'py, PyAny>,
        lease_duration: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let attempt = u32_arg(attempt, "attempt", Invalid::Argument)?;
        let lease = duration_arg(lease_duration, "lease_duration", Invalid::Argument)?;
        coroutine(py, async move {
            client
                .extend(&job_id, attempt, lease)
                .await
                .map(LeaseExpiry)
                .map_err(Failure::from)
        })
    }

    fn get_server_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client.get_server_info().await.map_err(Failure::from)
        })
    }

    #[pyo3(signature = (queue=None, max=1))]
    fn drain_dead_letters<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
        max: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let max = u32::try_from(max).map_err(|_| {
            Invalid::Argument.err(
                py,
                format!("max is {max}: it must be between 1 and {}", u32::MAX),
            )
        })?;
        coroutine(py, async move {
            client
                .drain_dead_letters(queue.as_deref(), max)
                .await
                .map_err(Failure::from)
        })
    }

    // Operator calls (`sepp.admin.v1`; sepp servers only).

    fn get_job<'py>(&self, py: Python<'py>, job_id: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client.get_job(&job_id).await.map_err(Failure::from)
        })
    }

    fn lookup_idempotency_key<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        idempotency_key: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client
                .lookup_idempotency_key(&queue, &idempotency_key)
                .await
                .map_err(Failure::from)
        })
    }

    #[pyo3(signature = (queue=None, *, page_size=None, page_token=None))]
    fn list_dead_letters<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
        page_size: Option<&Bound<'py, PyAny>>,
        page_token: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let page_size = opt_u32_arg(page_size, "page_size", Invalid::Argument)?;
        coroutine(py, async move {
            client
                .list_dead_letters(queue.as_deref(), page_size, page_token.as_deref())
                .await
                .map_err(Failure::from)
        })
    }

    #[pyo3(signature = (job_ids=None, *, queue=None, max=None))]
    fn requeue_dead_letters<'py>(
        &self,
        py: Python<'py>,
        job_ids: Option<&Bound<'py, PyAny>>,
        queue: Option<String>,
        max: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let selector = dead_letter_selector(py, opt_names_arg(job_ids, "job_ids")?, queue, max)?;
        coroutine(py, async move {
            client
                .requeue_dead_letters(&selector)
                .await
                .map_err(Failure::from)
        })
    }

    #[pyo3(signature = (job_ids=None, *, queue=None, max=None))]
    fn delete_dead_letters<'py>(
        &self,
        py: Python<'py>,
        job_ids: Option<&Bound<'py, PyAny>>,
        queue: Option<String>,
        max: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        let selector = dead_letter_selector(py, opt_names_arg(job_ids, "job_ids")?, queue, max)?;
        coroutine(py, async move {
            client
                .delete_dead_letters(&selector)
                .await
                .map_err(Failure::from)
        })
    }

    fn pause_queue<'py>(&self, py: Python<'py>, queue: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client.pause_queue(&queue).await.map_err(Failure::from)
        })
    }

    fn resume_queue<'py>(&self, py: Python<'py>, queue: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client.resume_queue(&queue).await.map_err(Failure::from)
        })
    }

    fn get_queue_stats<'py>(&self, py: Python<'py>, queue: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.core()?;
        coroutine(py, async move {
            client.get_queue_stats(&queue).await.map_err(Failure::from)
        })
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.take();
        coroutine(py, async { Ok::<(), Failure>(()) })
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        slf.get().core()?;
        coroutine(py, async move { Ok::<_, Failure>(Myself(slf)) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: &Bound<'py, PyAny>,
        exc_value: &Bound<'py, PyAny>,
        traceback: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Closing does not depend on how the block ended; exceptions propagate.
        let _ = (exc_type, exc_value, traceback);
        self.close(py)
    }

    fn __repr__(&self) -> String {
        match self.inner.read().ok().and_then(|g| g.clone()) {
            Some(c) => format!(
                "<SeppClient max_idempotency_key_bytes={}>",
                c.max_idempotency_key_bytes()
                    .map_or_else(|| "None".to_string(), |n| n.to_string())
            ),
            None => "<SeppClient closed>".into(),
        }
    }
}

/// The caller's current trace context, from OpenTelemetry's Python API when it is installed
/// (`sepp._tracing.current_trace_context`); `None` without it, or on any error (tracing never
/// fails an enqueue).
/// The function is looked up once, not imported again on every enqueue.
fn current_trace_context(py: Python<'_>) -> Option<sepp_rs::TraceContext> {
    static READ: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let got = READ
        .get_or_try_init(py, || {
            py.import("sepp._tracing")
                .and_then(|m| m.getattr("current_trace_context"))
                .map(Bound::unbind)
        })
        .and_then(|f| f.bind(py).call0())
        .and_then(|v| v.extract::<Option<(String, Option<String>)>>())
        .ok()??;
    Some(sepp_rs::TraceContext {
        traceparent: got.0,
        tracestate: got.1,
    })
}

/// A request with the trace context it sends, by the core's rule (`sepp_rs::trace::current_or`).
fn with_trace(
    request: Result<sepp_rs::EnqueueRequest, sepp_rs::Rejection>,
    current: Option<&sepp_rs::TraceContext>,
) -> Result<sepp_rs::EnqueueRequest, sepp_rs::Rejection> {
    request.map(|mut r| {
        r.trace_context = sepp_rs::trace::current_or(r.trace_context.as_ref(), current.cloned());
        r
    })
}
