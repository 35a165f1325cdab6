//! What the operator calls return (sepp servers only): [`JobInfo`], [`KeyRecord`],
//! [`DeadLetterPage`] and [`QueueStats`]. The calls themselves are methods of `SeppClient`.

use crate::call::ToPython;
use crate::job::cause_name;
use crate::repr::repr;
use crate::request::{Payload, TraceContext, custom_to_py};
use crate::time::opt_datetime_to_py;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use sepp_rs::Value;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// What the server knows about one job.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct JobInfo {
    #[pyo3(get)]
    job_id: String,
    #[pyo3(get)]
    state: &'static str,
    #[pyo3(get)]
    queue: String,
    #[pyo3(get)]
    job_type: String,
    #[pyo3(get)]
    attempt: u32,
    #[pyo3(get)]
    max_attempts: u32,
    #[pyo3(get)]
    priority: u32,
    enqueued_at: Option<SystemTime>,
    scheduled_at: Option<SystemTime>,
    lease_expires_at: Option<SystemTime>,
    #[pyo3(get)]
    last_reason: Option<String>,
    finished_at: Option<SystemTime>,
    #[pyo3(get)]
    dead_letter_cause: Option<&'static str>,
    #[pyo3(get)]
    idempotency_key: Option<String>,
    #[pyo3(get)]
    worker_id: Option<String>,
    payload: Option<Py<Payload>>,
    custom: BTreeMap<String, Value>,
    trace_context: Option<Py<TraceContext>>,
}

#[pymethods]
impl JobInfo {
    #[getter]
    fn enqueued_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.enqueued_at)
    }

    #[getter]
    fn scheduled_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.scheduled_at)
    }

    #[getter]
    fn lease_expires_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.lease_expires_at)
    }

    #[getter]
    fn finished_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.finished_at)
    }

    #[getter]
    fn payload(&self, py: Python<'_>) -> Option<Py<Payload>> {
        self.payload.as_ref().map(|p| p.clone_ref(py))
    }

    #[getter]
    fn custom<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        custom_to_py(py, &self.custom)
    }

    #[getter]
    fn trace_context(&self, py: Python<'_>) -> Option<Py<TraceContext>> {
        self.trace_context.as_ref().map(|t| t.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "JobInfo(job_id={}, state={}, queue={}, attempt={})",
            repr(py, &self.job_id),
            repr(py, self.state),
            repr(py, &self.queue),
            self.attempt
        )
    }
}

impl ToPython for sepp_rs::admin::JobInfo {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let state = self.state.as_str();
        let info = JobInfo {
            job_id: self.job_id,
            state,
            queue: self.queue,
            job_type: self.job_type,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            priority: self.priority,
            enqueued_at: self.enqueued_at,
            scheduled_at: self.scheduled_at,
            lease_expires_at: self.lease_expires_at,
            last_reason: self.last_reason,
            finished_at: self.finished_at,
            dead_letter_cause: self.dead_letter_cause.map(cause_name),
            idempotency_key: self.idempotency_key,
            worker_id: self.worker_id,
            payload: self
                .payload
                .map(|p| Py::new(py, Payload::from_core(py, p)))
                .transpose()?,
            custom: self.custom,
            trace_context: self
                .trace_context
                .map(|t| Py::new(py, TraceContext::from_core(t)))
                .transpose()?,
        };
        Ok(Bound::new(py, info)?.into_any())
    }
}

/// A live dedup record: the job an idempotency key names, and the record's lifetime.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct KeyRecord {
    #[pyo3(get)]
    job_id: String,
    created_at: Option<SystemTime>,
    expires_at: Option<SystemTime>,
}

#[pymethods]
impl KeyRecord {
    #[getter]
    fn created_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.created_at)
    }

    #[getter]
    fn expires_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        opt_datetime_to_py(py, self.expires_at)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("KeyRecord(job_id={})", repr(py, &self.job_id))
    }
}

impl ToPython for sepp_rs::admin::KeyRecord {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let record = KeyRecord {
            job_id: self.job_id,
            created_at: self.created_at,
            expires_at: self.expires_at,
        };
        Ok(Bound::new(py, record)?.into_any())
    }
}

/// One page of dead letters, listed without removing them.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct DeadLetterPage {
    records: Py<PyList>,
    #[pyo3(get)]
    next_page_token: Option<String>,
}

#[pymethods]
impl DeadLetterPage {
    /// A new list of the records.
    #[getter]
    fn records<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.records.bind(py).iter())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "DeadLetterPage(<{} records>, next_page_token={})",
            self.records.bind(py).len(),
            repr(py, &self.next_page_token)
        )
    }
}

impl ToPython for sepp_rs::admin::DeadLetterPage {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let records = self.records.to_python(py)?.cast_into::<PyList>()?.unbind();
        let page = DeadLetterPage {
            records,
            next_page_token: self.next_page_token,
        };
        Ok(Bound::new(py, page)?.into_any())
    }
}

/// A queue's job counts.
#[pyclass(module = "sepp._native", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueStats {
    ready: u64,
    scheduled: u64,
    in_flight: u64,
    dead_lettered: u64,
    dedup_records: u64,
    paused: bool,
}

#[pymethods]
impl QueueStats {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "QueueStats(ready={}, scheduled={}, in_flight={}, dead_lettered={}, \
             dedup_records={}, paused={})",
            self.ready,
            self.scheduled,
            self.in_flight,
            self.dead_lettered,
            self.dedup_records,
            repr(py, self.paused)
        )
    }
}

impl ToPython for sepp_rs::admin::QueueStats {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let stats = QueueStats {
            ready: self.ready,
            scheduled: self.scheduled,
            in_flight: self.in_flight,
            dead_lettered: self.dead_lettered,
            dedup_records: self.dedup_records,
            paused: self.paused,
        };
        Ok(Bound::new(py, stats)?.into_any())
    }
}
