//! Errors: the core's errors become instances of the exception classes of `sepp.errors`
//! (picked there by the stable code), and a job's rejection becomes the [`Rejection`] value.
//!
//! The classes live in Python so that they are plain, subclassable, picklable exceptions; this
//! module only passes the core's code, message and fields to `sepp.errors._from_native`.

use crate::repr::repr;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use sepp_rs::{BatchError, ClientError, EnqueueError, ErrorCode, LeaseError, ReserveError};
use std::time::{Duration, SystemTime};

/// Why one job was not accepted, as a value (a batch result, or `JobRejectedError.rejection`).
///
/// Only the fields of its kind are set; the others are `None`.
#[pyclass(module = "sepp._native", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rejection {
    /// The stable code, e.g. `IDEMPOTENCY_KEY_TOO_LONG`.
    code: &'static str,
    /// The core's message, naming the field and the limit.
    message: String,
    /// Whether the same job may be accepted later (queue full or closing).
    transient: bool,
    /// The queue named by `UNKNOWN_QUEUE`, `QUEUE_FULL` and `QUEUE_CLOSING`.
    queue: Option<String>,
    /// The limit of the size and count rejections, and the depth limit of `QUEUE_FULL`.
    limit: Option<u64>,
    /// The size or count sent, for the size and count rejections.
    actual: Option<u64>,
    /// The encoding sent, for `ENCODING_NOT_ALLOWED`.
    encoding: Option<String>,
    /// The allowed encodings or job types.
    allowed: Option<Vec<String>>,
    /// The job type sent, for `JOB_TYPE_NOT_ALLOWED`.
    job_type: Option<String>,
    /// The custom key, for `CUSTOM_KEY_TOO_LONG`.
    key: Option<String>,
    /// The schedule horizon, for `SCHEDULED_TOO_FAR`.
    horizon: Option<Duration>,
    /// The requested time, for `SCHEDULED_TOO_FAR` (the core's `actual`).
    scheduled_at: Option<SystemTime>,
    /// The job the key names, for `IDEMPOTENCY_KEY_CONFLICT`.
    original_job_id: Option<String>,
}

impl Rejection {
    /// Converts the core's rejection. The fields are destructured whole, so a field added to
    /// the core's `RejectionFields` does not compile here until it is handed on.
    pub(crate) fn from_core(r: &sepp_rs::Rejection) -> Self {
        let sepp_rs::RejectionFields {
            queue,
            limit,
            actual,
            encoding,
            allowed,
            job_type,
            key,
            horizon,
            scheduled_at,
            original_job_id,
        } = r.fields();
        Rejection {
            code: r.code().as_str(),
            message: r.to_string(),
            transient: r.is_transient(),
            queue,
            limit,
            actual,
            encoding,
            allowed,
            job_type,
            key,
            horizon,
            scheduled_at,
            original_job_id,
        }
    }
}

#[pymethods]
impl Rejection {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Rejection(code={}, message={})",
            repr(py, self.code),
            repr(py, &self.message)
        )
    }
}

/// Warns with a `DeprecationWarning` pointing at the caller: `message` names the old name and
/// the new one.
pub(crate) fn warn_deprecated(py: Python<'_>, message: &str) -> PyResult<()> {
    let message =
        std::ffi::CString::new(message).map_err(|e| PyTypeError::new_err(e.to_string()))?;
    PyErr::warn(
        py,
        &py.get_type::<pyo3::exceptions::PyDeprecationWarning>(),
        &message,
        1,
    )
}

/// Which sepp error reports an unusable value given from Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// An argument of a call: `INVALID_ARGUMENT`.
    Argument,
    /// A connection setting: `INVALID_CONFIG`.
    Config,
}

impl Invalid {
    /// The failure for `message` (which names the argument).
    pub(crate) fn failure(self, message: impl Into<String>) -> Failure {
        let message = message.into();
        match self {
            Invalid::Argument => Failure::call(ErrorCode::InvalidArgument, message),
            Invalid::Config => Failure::call(ErrorCode::InvalidConfig, message),
        }
    }

    /// The Python exception for `message`.
    pub(crate) fn err(self, py: Python<'_>, message: impl Into<String>) -> PyErr {
        self.failure(message).into_pyerr(py)
    }
}

/// A failed call, not yet turned into a Python exception (that needs the GIL).
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The call failed as a whole.
    Call {
        /// The core's stable code.
        code: ErrorCode,
        /// What happened.
        message: String,
        /// The core's verdict on retrying the same call.
        retryable: bool,
        /// The gRPC status code, when the failure came from one.
        grpc_code: Option<i32>,
        /// The job, for the lease errors of ack, nack and extend.
        job_id: Option<String>,
    },
    /// Jobs were rejected: `(index in the request, why)`, at least one, in index order.
    Rejected(Vec<(u32, sepp_rs::Rejection)>),
}

impl Failure {
    fn call(code: ErrorCode, message: String) -> Self {
        Failure::Call {
            code,
            message,
            retryable: false,
            grpc_code: None,
            job_id: None,
        }
    }

    /// The `sepp.errors` exception for this failure.
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        self.build(py).unwrap_or_else(|e| e)
    }

    fn build(self, py: Python<'_>) -> PyResult<PyErr> {
        static FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let factory = FACTORY.get_or_try_init(py, || {
            py.import("sepp.errors")?
                .getattr("_from_native")
                .map(Bound::unbind)
        })?;
        let exc = match self {
            Failure::Call {
                code,
                message,
                retryable,
                grpc_code,
                job_id,
            } => factory.call1(
                py,
                (
                    code.as_str(),
                    message,
                    retryable,
                    grpc_code,
                    job_id,
                    None::<Vec<(u32, Rejection)>>,
                ),
            )?,
            Failure::Rejected(list) => {
                let failures: Vec<(u32, Rejection)> = list
                    .iter()
                    .map(|(i, r)| (*i, Rejection::from_core(r)))
                    .collect();
                let Some((_, first)) = list.first() else {
                    return Err(PyTypeError::new_err("no rejection to report"));
                };
                factory.call1(
                    py,
                    (
                        first.code().as_str(),
                        first.to_string(),
                        first.is_transient(),
                        None::<i32>,
                        None::<String>,
                        Some(failures),
                    ),
                )?
            }
        };
        Ok(PyErr::from_value(exc.into_bound(py)))
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Call {
            code: e.code(),
            message: e.message().to_string(),
            retryable: e.is_retryable(),
            grpc_code: e.grpc_code(),
            job_id: None,
        }
    }
}

impl From<EnqueueError> for Failure {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::Rejected(r) => Failure::Rejected(vec![(0, r)]),
            EnqueueError::Client(c) => c.into(),
        }
    }
}

impl From<BatchError> for Failure {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::Client(c) => c.into(),
            BatchError::Invalid(_) => Failure::call(e.code(), e.to_string()),
        }
    }
}

impl From<ReserveError> for Failure {
    fn from(e: ReserveError) -> Self {
        match e {
            ReserveError::Client(c) => c.into(),
            ReserveError::Invalid(_) => Failure::call(e.code(), e.to_string()),
        }
    }
}

impl From<LeaseError> for Failure {
    fn from(e: LeaseError) -> Self {
        let code = e.code();
        let text = e.to_string();
        match e {
            LeaseError::Client(c) => c.into(),
            // The server's message names the job already; the core's text would repeat it.
            LeaseError::NotInFlight { job_id, message }
            | LeaseError::AttemptMismatch { job_id, message } => Failure::Call {
                code,
                message,
                retryable: false,
                grpc_code: None,
                job_id: Some(job_id),
            },
            LeaseError::Invalid(_) => Failure::call(code, text),
        }
    }
}
