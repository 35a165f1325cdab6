//! What the server returns, as frozen Python values: [`EnqueueAck`], [`Job`],
//! [`DeadLetterRecord`] and [`ServerInfo`].

use crate::call::ToPython;
use crate::repr::repr;
use crate::request::{Payload, TraceContext, custom_to_py};
use crate::time::{datetime_to_py, opt_datetime_to_py};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sepp_rs::Value;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The answer to an accepted enqueue.
#[pyclass(module = "sepp._native", frozen, eq, hash, get_all)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EnqueueAck {
    job_id: String,
    deduplicated: bool,
    /// On a dedup hit from a sepp server: where the job is (`"READY"`, `"ACKED"`, ...).
    original_state: Option<&'static str>,
    /// On a dedup hit on a queue with `on_duplicate = "replace_pending"`: whether this
    /// enqueue's contents replaced the pending job's.
    replaced: bool,
}

#[pymethods]
impl EnqueueAck {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "EnqueueAck(job_id={}, deduplicated={}, original_state={}, replaced={})",
            repr(py, &self.job_id),
            repr(py, self.deduplicated),
            repr(py, self.original_state),
            repr(py, self.replaced)
        )
    }
}

impl ToPython for sepp_rs::EnqueueAck {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let ack = EnqueueAck {
            job_id: self.job_id,
            deduplicated: self.deduplicated,
            original_state: self.original_state.map(|s| s.as_str()),
            replaced: self.replaced,
        };
        Ok(Bound::new(py, ack)?.into_any())
    }
}

/// A leased job.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct Job {
    #[pyo3(get)]
    id: String,
    #[pyo3(get)]
    queue: String,
    #[pyo3(get)]
    job_type: String,
    payload: Option<Py<Payload>>,
    #[pyo3(get)]
    priority: u32,
    trace_context: Option<Py<TraceContext>>,
    enqueued_at: Option<SystemTime>,
    #[pyo3(get)]
    attempt: u32,
    #[pyo3(get)]
    max_attempts: u32,
    lease_expires_at: Option<SystemTime>,
    custom: BTreeMap<String, Value>,
    scheduled_at: Option<SystemTime>,
    #[pyo3(get)]
    is_last_attempt: bool,
}

impl Job {
    /// Converts the core's job.
    pub(crate) fn from_core(py: Python<'_>, j: sepp_rs::Job) -> PyResult<Self> {
        let is_last_attempt = j.is_last_attempt();
        Ok(Job {
            payload: j
                .payload
                .map(|p| Py::new(py, Payload::from_core(py, p)))
                .transpose()?,
            trace_context: j
                .trace_context
                .map(|t| Py::new(py, TraceContext::from_core(t)))
                .transpose()?,
            id: j.id,
            queue: j.queue,
            job_type: j.job_type,
            priority: j.priority,
            enqueued_at: j.enqueued_at,
            attempt: j.attempt,
            max_attempts: j.max_attempts,
            lease_expires_at: j.lease_expires_at,
            custom: j.custom,
            scheduled_at: j.scheduled_at,
            is_last_attempt,
        })
    }

    /// The job's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Which delivery this is.
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[pymethods]
impl Job {
    #[getter]
    fn payload(&self, py: Python<'_>) -> Option<Py<Payload>> {
        self.payload.as_ref().map(|p| p.clone_ref(py))
    }

    #[getter]
    fn trace_context(&self, py: Python<'_>) -> Option<Py<TraceContext>> {
        self.trace_context.as_ref().map(|t| t.clone_ref(py))
    }

    #[getter]
    fn enqueued_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.enqueued_at)
    }

    #[getter]
    fn lease_expires_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.lease_expires_at)
    }

    #[getter]
    fn scheduled_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.scheduled_at)
    }

    #[getter]
    fn custom<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        custom_to_py(py, &self.custom)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Job(id={}, queue={}, job_type={}, attempt={})",
            repr(py, &self.id),
            repr(py, &self.queue),
            repr(py, &self.job_type),
            self.attempt
        )
    }
}

impl ToPython for sepp_rs::Job {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(Bound::new(py, Job::from_core(py, self)?)?.into_any())
    }
}

/// A dead-lettered job, removed from the server by `drain_dead_letters`.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct DeadLetterRecord {
    job: Py<Job>,
    #[pyo3(get)]
    cause: &'static str,
    failed_at: Option<SystemTime>,
    #[pyo3(get)]
    final_attempt: u32,
    #[pyo3(get)]
    last_reason: Option<String>,
}

#[pymethods]
impl DeadLetterRecord {
    #[getter]
    fn job(&self, py: Python<'_>) -> Py<Job> {
        self.job.clone_ref(py)
    }

    #[getter]
    fn failed_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.failed_at)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "DeadLetterRecord(job_id={}, cause={}, final_attempt={})",
            repr(py, &self.job.get().id),
            repr(py, self.cause),
            self.final_attempt
        )
    }
}

/// The stable name of a dead-letter cause.
pub(crate) fn cause_name(cause: sepp_rs::DeadLetterCause) -> &'static str {
    use sepp_rs::DeadLetterCause as C;
    match cause {
        C::Unspecified => "UNSPECIFIED",
        C::AttemptsExhausted => "ATTEMPTS_EXHAUSTED",
        C::Rejected => "REJECTED",
        C::LeaseExpired => "LEASE_EXPIRED",
        C::Admin => "ADMIN",
    }
}

impl ToPython for sepp_rs::DeadLetterRecord {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let record = DeadLetterRecord {
            job: Py::new(py, Job::from_core(py, self.job)?)?,
            cause: cause_name(self.cause),
            failed_at: self.failed_at,
            final_attempt: self.final_attempt,
            last_reason: self.last_reason,
        };
        Ok(Bound::new(py, record)?.into_any())
    }
}

/// The server's version and limits (server-wide defaults; a queue may differ).
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct ServerInfo {
    #[pyo3(get)]
    server_version: String,
    #[pyo3(get)]
    supported_protocol_versions: Vec<String>,
    server_time: Option<SystemTime>,
    #[pyo3(get)]
    restricts_encodings: bool,
    #[pyo3(get)]
    allowed_encodings: Vec<String>,
    #[pyo3(get)]
    max_payload_bytes: u64,
    #[pyo3(get)]
    max_custom_entries: u32,
    #[pyo3(get)]
    max_custom_total_bytes: u64,
    #[pyo3(get)]
    max_custom_key_bytes: u32,
    #[pyo3(get)]
    max_queue_name_bytes: u32,
    #[pyo3(get)]
    max_job_type_bytes: u32,
    #[pyo3(get)]
    max_idempotency_key_bytes: u32,
    #[pyo3(get)]
    max_schedule_horizon: Option<Duration>,
    #[pyo3(get)]
    max_enqueue_batch: u32,
    #[pyo3(get)]
    max_reserve_batch: u32,
    #[pyo3(get)]
    max_reserve_queues: u32,
    #[pyo3(get)]
    max_wait_timeout: Option<Duration>,
    #[pyo3(get)]
    max_lease_duration: Option<Duration>,
    #[pyo3(get)]
    strict_queues: bool,
    #[pyo3(get)]
    dead_letter_retention_enabled: bool,
    #[pyo3(get)]
    dedup_window: Option<Duration>,
}

#[pymethods]
impl ServerInfo {
    #[getter]
    fn server_time<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.server_time)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ServerInfo(server_version={}, max_idempotency_key_bytes={})",
            repr(py, &self.server_version),
            self.max_idempotency_key_bytes
        )
    }
}

impl ToPython for sepp_rs::ServerInfo {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let info = ServerInfo {
            server_version: self.server_version,
            supported_protocol_versions: self.supported_protocol_versions,
            server_time: self.server_time,
            restricts_encodings: self.restricts_encodings,
            allowed_encodings: self.allowed_encodings,
            max_payload_bytes: self.max_payload_bytes,
            max_custom_entries: self.max_custom_entries,
            max_custom_total_bytes: self.max_custom_total_bytes,
            max_custom_key_bytes: self.max_custom_key_bytes,
            max_queue_name_bytes: self.max_queue_name_bytes,
            max_job_type_bytes: self.max_job_type_bytes,
            max_idempotency_key_bytes: self.max_idempotency_key_bytes,
            max_schedule_horizon: self.max_schedule_horizon,
            max_enqueue_batch: self.max_enqueue_batch,
            max_reserve_batch: self.max_reserve_batch,
            max_reserve_queues: self.max_reserve_queues,
            max_wait_timeout: self.max_wait_timeout,
            max_lease_duration: self.max_lease_duration,
            strict_queues: self.strict_queues,
            dead_letter_retention_enabled: self.dead_letter_retention_enabled,
            dedup_window: self.dedup_window,
        };
        Ok(Bound::new(py, info)?.into_any())
    }
}

/// The new lease expiry returned by `extend`.
pub(crate) struct LeaseExpiry(pub(crate) SystemTime);

impl ToPython for LeaseExpiry {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        datetime_to_py(py, self.0)
    }
}
