//! What Python sends: [`EnqueueRequest`] (checked by the core's `validate` when constructed),
//! its [`Payload`] and [`TraceContext`], the [`NackRetry`] strategy, and the connection
//! settings [`RetryPolicy`] and [`TlsOptions`].

use crate::error::{Invalid, warn_deprecated};
use crate::repr::repr;
use crate::time::{datetime_to_py, datetime_value, duration_arg, opt_duration_arg, type_name};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyMapping, PyString};
use sepp_rs::Value;
use std::collections::BTreeMap;

/// Reads the integer argument `name` as a `u32`.
///
/// # Errors
/// `TypeError` for a non-int (a `bool` included); the `invalid` error when out of range.
pub(crate) fn u32_arg(obj: &Bound<'_, PyAny>, name: &str, invalid: Invalid) -> PyResult<u32> {
    u32_value(obj, name)?.map_err(|m| invalid.err(obj.py(), m))
}

/// Reads the string argument `name`: `TypeError` naming it in its message for anything but a
/// `str` (pyo3's own conversion error names a constructor's argument only in a note).
fn str_value(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => s.extract(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be str, not {}",
            type_name(obj)
        ))),
    }
}

/// Reads the optional string argument `name` (`None` and omitted alike: `None`), with
/// [`str_value`]'s `TypeError`.
pub(crate) fn opt_str_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => str_value(o, name).map(Some),
        _ => Ok(None),
    }
}

/// Reads the optional bool argument `name` (`None` and omitted alike: `None`): `TypeError`
/// naming it for anything but a `bool` (an int included: `1` is not `True` here).
pub(crate) fn opt_bool_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<bool>> {
    match obj {
        Some(o) if !o.is_none() => match o.cast::<PyBool>() {
            Ok(b) => Ok(Some(b.is_true())),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{name} must be bool, not {}",
                type_name(o)
            ))),
        },
        _ => Ok(None),
    }
}

/// Reads the integer `name` as a `u32`: `Err` (`TypeError`) for a non-int, `Ok(Err(message))`
/// for an int out of range, with the message the Node package gives for the same value.
fn u32_value(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Result<u32, String>> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be int, not {}",
            type_name(obj)
        )));
    }
    let v = obj.extract::<i64>().unwrap_or(i64::MAX);
    Ok(u32::try_from(v).map_err(|_| {
        format!(
            "{name} is {obj}: expected an integer from 0 to {}",
            u32::MAX
        )
    }))
}

/// Like [`u32_arg`], with `None` for a missing or `None` argument.
pub(crate) fn opt_u32_arg(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    invalid: Invalid,
) -> PyResult<Option<u32>> {
    match obj {
        Some(o) if !o.is_none() => u32_arg(o, name, invalid).map(Some),
        _ => Ok(None),
    }
}

/// Copies a `bytes` or `bytearray` argument.
fn bytes_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        Ok(b.as_bytes().to_vec())
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        Ok(b.to_vec())
    } else {
        Err(PyTypeError::new_err(format!(
            "{name} must be bytes, not {}",
            type_name(obj)
        )))
    }
}

/// Reads the `custom` mapping: `str` keys, `str | int | float | bool` values; `Ok(Err(_))`
/// names an int outside the 64-bit range.
fn custom_arg(obj: &Bound<'_, PyAny>) -> PyResult<Result<BTreeMap<String, Value>, String>> {
    let mapping = obj.cast::<PyMapping>().map_err(|_| {
        PyTypeError::new_err(format!(
            "custom must be a mapping of str to str, int, float or bool, not {}",
            type_name(obj)
        ))
    })?;
    let mut out = BTreeMap::new();
    for item in mapping.items()?.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let key: String = k
            .cast::<PyString>()
            .map_err(|_| {
                PyTypeError::new_err(format!("custom keys must be str, not {}", type_name(&k)))
            })?
            .extract()?;
        let value = if let Ok(b) = v.cast::<PyBool>() {
            Value::Bool(b.is_true())
        } else if v.is_instance_of::<PyInt>() {
            match v.extract::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => {
                    return Ok(Err(format!(
                        "custom[{key:?}] is outside the signed 64-bit integer range"
                    )));
                }
            }
        } else if let Ok(f) = v.cast::<PyFloat>() {
            Value::Double(f.value())
        } else if let Ok(s) = v.cast::<PyString>() {
            Value::String(s.extract()?)
        } else {
            return Err(PyTypeError::new_err(format!(
                "custom[{key:?}] must be str, int, float or bool, not {}",
                type_name(&v)
            )));
        };
        out.insert(key, value);
    }
    Ok(Ok(out))
}

/// A custom value as a Python `str`, `int`, `float` or `bool`.
pub(crate) fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Double(d) => PyFloat::new(py, *d).into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
    })
}

/// A custom map as a new `dict`.
pub(crate) fn custom_to_py<'py>(
    py: Python<'py>,
    custom: &BTreeMap<String, Value>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in custom {
        d.set_item(k, value_to_py(py, v)?)?;
    }
    Ok(d)
}

/// A job's data and its encoding hint.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct Payload {
    data: Py<PyBytes>,
    encoding: String,
}

impl Payload {
    /// A payload from the core's, for a job read from the server.
    pub(crate) fn from_core(py: Python<'_>, p: sepp_rs::Payload) -> Self {
        Payload {
            data: PyBytes::new(py, &p.data).unbind(),
            encoding: p.encoding,
        }
    }

    fn to_core(&self, py: Python<'_>) -> sepp_rs::Payload {
        sepp_rs::Payload {
            data: self.data.bind(py).as_bytes().to_vec(),
            encoding: self.encoding.clone(),
        }
    }
}

#[pymethods]
impl Payload {
    #[new]
    fn new(py: Python<'_>, data: &Bound<'_, PyAny>, encoding: String) -> PyResult<Self> {
        let data = if let Ok(b) = data.cast::<PyBytes>() {
            b.clone().unbind()
        } else {
            PyBytes::new(py, &bytes_arg(data, "data")?).unbind()
        };
        Ok(Payload { data, encoding })
    }

    #[getter]
    fn data(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }

    #[getter]
    fn encoding(&self) -> &str {
        &self.encoding
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Payload(<{} bytes>, {})",
            self.data.bind(py).as_bytes().len(),
            repr(py, &self.encoding)
        )
    }
}

/// W3C trace context.
#[pyclass(module = "sepp._native", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// The Python value of the core's trace context.
    pub(crate) fn from_core(t: sepp_rs::TraceContext) -> Self {
        TraceContext {
            traceparent: t.traceparent,
            tracestate: t.tracestate,
        }
    }
}

#[pymethods]
impl TraceContext {
    #[new]
    #[pyo3(signature = (traceparent, tracestate=None))]
    fn new(traceparent: String, tracestate: Option<String>) -> Self {
        TraceContext {
            traceparent,
            tracestate,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TraceContext({}, tracestate={})",
            repr(py, &self.traceparent),
            repr(py, &self.tracestate)
        )
    }
}

/// One job to enqueue. Only the argument types are checked here; the values are checked by
/// the core when the request is sent, as in every language.
#[pyclass(module = "sepp._native", frozen)]
pub(crate) struct EnqueueRequest {
    /// The request the core sends.
    pub(crate) inner: sepp_rs::EnqueueRequest,
    /// The `Payload` object given, returned as is by the getter.
    payload: Option<Py<Payload>>,
    /// Why a value given could not become part of `inner` (a count out of range, a naive
    /// datetime, ...): the request's `INVALID_REQUEST` rejection, reported when it is sent.
    fault: Option<String>,
}

impl EnqueueRequest {
    /// The core's request, or its rejection for a value that could not be held.
    pub(crate) fn prepared(&self) -> Result<sepp_rs::EnqueueRequest, sepp_rs::Rejection> {
        match &self.fault {
            Some(message) => Err(sepp_rs::Rejection::InvalidRequest {
                message: message.clone(),
            }),
            None => Ok(self.inner.clone()),
        }
    }
}

/// Keeps the first value fault of a request, returning the value when there is none.
fn keep<T>(fault: &mut Option<String>, value: Result<T, String>) -> Option<T> {
    value.map_err(|m| fault.get_or_insert(m).clone()).ok()
}

#[pymethods]
impl EnqueueRequest {
    #[new]
    #[pyo3(signature = (
        queue, job_type, *, payload=None, idempotency_key=None, priority=None,
        max_attempts=None, custom=None, trace_context=None, scheduled_at=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        queue: &Bound<'_, PyAny>,
        job_type: &Bound<'_, PyAny>,
        payload: Option<&Bound<'_, PyAny>>,
        idempotency_key: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        max_attempts: Option<&Bound<'_, PyAny>>,
        custom: Option<&Bound<'_, PyAny>>,
        trace_context: Option<&Bound<'_, PyAny>>,
        scheduled_at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let payload = opt_class_arg::<Payload>(payload, "payload")?;
        let trace_context = opt_class_arg::<TraceContext>(trace_context, "trace_context")?;
        let queue = str_value(queue, "queue")?;
        let job_type = str_value(job_type, "job_type")?;
        let idempotency_key = match idempotency_key.filter(|k| !k.is_none()) {
            Some(k) => Some(str_value(k, "idempotency_key")?),
            None => None,
        };
        let mut fault = None;
        let count = |obj: Option<&Bound<'_, PyAny>>, name: &str| match obj {
            Some(o) if !o.is_none() => u32_value(o, name).map(Some),
            _ => Ok(None),
        };
        let priority = count(priority, "priority")?.and_then(|r| keep(&mut fault, r));
        let max_attempts = count(max_attempts, "max_attempts")?.and_then(|r| keep(&mut fault, r));
        let custom = match custom.filter(|c| !c.is_none()) {
            Some(c) => keep(&mut fault, custom_arg(c)?).unwrap_or_default(),
            None => BTreeMap::new(),
        };
        let scheduled_at = match scheduled_at.filter(|t| !t.is_none()) {
            Some(t) => keep(&mut fault, datetime_value(t, "scheduled_at")?),
            None => None,
        };
        let inner = sepp_rs::EnqueueRequest {
            queue,
            job_type,
            payload: payload.as_ref().map(|p| p.get().to_core(py)),
            idempotency_key,
            priority,
            max_attempts,
            custom,
            trace_context: trace_context.map(|t| {
                let t = t.borrow();
                sepp_rs::TraceContext {
                    traceparent: t.traceparent.clone(),
                    tracestate: t.tracestate.clone(),
                }
            }),
            scheduled_at,
        };
        Ok(EnqueueRequest {
            inner,
            payload: payload.map(Bound::unbind),
            fault,
        })
    }

    #[getter]
    fn queue(&self) -> &str {
        &self.inner.queue
    }

    #[getter]
    fn job_type(&self) -> &str {
        &self.inner.job_type
    }

    #[getter]
    fn payload(&self, py: Python<'_>) -> Option<Py<Payload>> {
        self.payload.as_ref().map(|p| p.clone_ref(py))
    }

    #[getter]
    fn idempotency_key(&self) -> Option<&str> {
        self.inner.idempotency_key.as_deref()
    }

    #[getter]
    fn priority(&self) -> Option<u32> {
        self.inner.priority
    }

    #[getter]
    fn max_attempts(&self) -> Option<u32> {
        self.inner.max_attempts
    }

    #[getter]
    fn custom<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        custom_to_py(py, &self.inner.custom)
    }

    #[getter]
    fn trace_context(&self) -> Option<TraceContext> {
        self.inner
            .trace_context
            .clone()
            .map(TraceContext::from_core)
    }

    #[getter]
    fn scheduled_at<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner
            .scheduled_at
            .map(|t| datetime_to_py(py, t))
            .transpose()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let mut s = format!(
            "EnqueueRequest({}, {}",
            repr(py, &self.inner.queue),
            repr(py, &self.inner.job_type)
        );
        if let Some(k) = &self.inner.idempotency_key {
            s.push_str(&format!(", idempotency_key={}", repr(py, k)));
        }
        s.push(')');
        s
    }
}

/// What a nack asks for: the queue's retry policy, a retry after a delay, or a dead letter.
#[pyclass(module = "sepp._native", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NackRetry {
    /// The core's strategy.
    pub(crate) inner: sepp_rs::NackRetry,
}

#[pymethods]
impl NackRetry {
    #[staticmethod]
    fn default() -> Self {
        NackRetry {
            inner: sepp_rs::NackRetry::Default,
        }
    }

    #[staticmethod]
    fn delay(delay: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(NackRetry {
            inner: sepp_rs::NackRetry::Delay(duration_arg(delay, "delay", Invalid::Argument)?),
        })
    }

    #[staticmethod]
    fn dead_letter() -> Self {
        NackRetry {
            inner: sepp_rs::NackRetry::DeadLetter,
        }
    }

    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            sepp_rs::NackRetry::Default => "default",
            sepp_rs::NackRetry::Delay(_) => "delay",
            sepp_rs::NackRetry::DeadLetter => "dead_letter",
        }
    }

    #[getter]
    fn retry_delay(&self) -> Option<std::time::Duration> {
        match self.inner {
            sepp_rs::NackRetry::Delay(d) => Some(d),
            _ => None,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.inner {
            sepp_rs::NackRetry::Default => "NackRetry.default()".into(),
            sepp_rs::NackRetry::Delay(d) => format!("NackRetry.delay({})", repr(py, d)),
            sepp_rs::NackRetry::DeadLetter => "NackRetry.dead_letter()".into(),
        }
    }
}

/// Automatic retries of the calls that are safe to retry (the core's table).
#[pyclass(module = "sepp._native", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryPolicy {
    /// The core's policy.
    pub(crate) inner: sepp_rs::RetryPolicy,
}

/// Warns that `RetryPolicy.{old}` is deprecated in favour of `new`.
fn deprecated(py: Python<'_>, old: &str, new: &str) -> PyResult<()> {
    warn_deprecated(py, &format!("RetryPolicy.{old} is deprecated: use {new}"))
}

#[pymethods]
impl RetryPolicy {
    #[new]
    #[pyo3(signature = (
        *, max_retries=None, first_retry_delay=None, max_retry_delay=None, multiplier=None,
        max_attempts=None, initial_backoff=None, max_backoff=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        max_retries: Option<&Bound<'_, PyAny>>,
        first_retry_delay: Option<&Bound<'_, PyAny>>,
        max_retry_delay: Option<&Bound<'_, PyAny>>,
        multiplier: Option<f64>,
        max_attempts: Option<&Bound<'_, PyAny>>,
        initial_backoff: Option<&Bound<'_, PyAny>>,
        max_backoff: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut inner = sepp_rs::RetryPolicy::default();
        // The names of earlier releases: `max_attempts` counted the first try too.
        fn old<'py>(
            arg: Option<&Bound<'py, PyAny>>,
            name: &str,
            new: &str,
        ) -> PyResult<Option<Bound<'py, PyAny>>> {
            match arg {
                Some(a) if !a.is_none() => deprecated(a.py(), name, new).map(|()| Some(a.clone())),
                _ => Ok(None),
            }
        }
        let max_attempts = old(max_attempts, "max_attempts", "max_retries")?;
        let initial_backoff = old(initial_backoff, "initial_backoff", "first_retry_delay")?;
        let max_backoff = old(max_backoff, "max_backoff", "max_retry_delay")?;
        for (new, old, names) in [
            (max_retries, &max_attempts, "max_retries and max_attempts"),
            (
                first_retry_delay,
                &initial_backoff,
                "first_retry_delay and initial_backoff",
            ),
            (
                max_retry_delay,
                &max_backoff,
                "max_retry_delay and max_backoff",
            ),
        ] {
            if new.is_some_and(|n| !n.is_none()) && old.is_some() {
                return Err(Invalid::Config.err(py, format!("give one of {names}, not both")));
            }
        }
        if let Some(n) = opt_u32_arg(max_retries, "max_retries", Invalid::Config)? {
            inner.max_retries = n;
        }
        if let Some(n) = opt_u32_arg(max_attempts.as_ref(), "max_attempts", Invalid::Config)? {
            inner.max_retries = n.saturating_sub(1);
        }
        let first = first_retry_delay.or(initial_backoff.as_ref());
        let name = if initial_backoff.is_some() {
            "initial_backoff"
        } else {
            "first_retry_delay"
        };
        if let Some(d) = opt_duration_arg(first, name, Invalid::Config)? {
            inner.first_retry_delay = d;
        }
        let most = max_retry_delay.or(max_backoff.as_ref());
        let name = if max_backoff.is_some() {
            "max_backoff"
        } else {
            "max_retry_delay"
        };
        if let Some(d) = opt_duration_arg(most, name, Invalid::Config)? {
            inner.max_retry_delay = d;
        }
        if let Some(m) = multiplier {
            inner.multiplier = m;
        }
        Ok(RetryPolicy { inner })
    }

    #[getter]
    fn max_retries(&self) -> u32 {
        self.inner.max_retries
    }

    #[getter]
    fn first_retry_delay(&self) -> std::time::Duration {
        self.inner.first_retry_delay
    }

    #[getter]
    fn max_retry_delay(&self) -> std::time::Duration {
        self.inner.max_retry_delay
    }

    #[getter]
    fn multiplier(&self) -> f64 {
        self.inner.multiplier
    }

    #[getter]
    fn max_attempts(&self, py: Python<'_>) -> PyResult<u32> {
        deprecated(py, "max_attempts", "max_retries")?;
        Ok(self.inner.max_retries.saturating_add(1))
    }

    #[getter]
    fn initial_backoff(&self, py: Python<'_>) -> PyResult<std::time::Duration> {
        deprecated(py, "initial_backoff", "first_retry_delay")?;
        Ok(self.inner.first_retry_delay)
    }

    #[getter]
    fn max_backoff(&self, py: Python<'_>) -> PyResult<std::time::Duration> {
        deprecated(py, "max_backoff", "max_retry_delay")?;
        Ok(self.inner.max_retry_delay)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "RetryPolicy(max_retries={}, first_retry_delay={}, max_retry_delay={}, multiplier={})",
            self.inner.max_retries,
            repr(py, self.inner.first_retry_delay),
            repr(py, self.inner.max_retry_delay),
            repr(py, self.inner.multiplier)
        )
    }
}

/// TLS settings for the connection.
#[pyclass(module = "sepp._native", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct TlsOptions {
    /// The core's settings.
    pub(crate) inner: sepp_rs::client::TlsOptions,
}

#[pymethods]
impl TlsOptions {
    #[new]
    #[pyo3(signature = (*, ca_pem=None, domain=None, client_cert_pem=None, client_key_pem=None))]
    fn new(
        ca_pem: Option<&Bound<'_, PyAny>>,
        domain: Option<String>,
        client_cert_pem: Option<&Bound<'_, PyAny>>,
        client_key_pem: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        fn pem(p: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<Vec<u8>>> {
            Ok(match p {
                Some(p) if p.is_instance_of::<PyString>() => {
                    Some(p.extract::<String>()?.into_bytes())
                }
                Some(p) if !p.is_none() => Some(bytes_arg(p, name)?),
                _ => None,
            })
        }
        Ok(TlsOptions {
            inner: sepp_rs::client::TlsOptions {
                ca_pem: pem(ca_pem, "ca_pem")?,
                domain,
                client_cert_pem: pem(client_cert_pem, "client_cert_pem")?,
                client_key_pem: pem(client_key_pem, "client_key_pem")?,
            },
        })
    }

    #[getter]
    fn client_cert_pem<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner
            .client_cert_pem
            .as_ref()
            .map(|p| PyBytes::new(py, p))
    }

    #[getter]
    fn ca_pem<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.ca_pem.as_ref().map(|p| PyBytes::new(py, p))
    }

    #[getter]
    fn domain(&self) -> Option<&str> {
        self.inner.domain.as_deref()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TlsOptions(ca_pem={}, domain={}, client_cert_pem={}, client_key_pem={})",
            if self.inner.ca_pem.is_some() {
                "<pem>"
            } else {
                "None"
            },
            repr(py, &self.inner.domain),
            if self.inner.client_cert_pem.is_some() {
                "<pem>"
            } else {
                "None"
            },
            // Never shown, even in part.
            if self.inner.client_key_pem.is_some() {
                "<secret>"
            } else {
                "None"
            }
        )
    }
}

/// Reads the list of names `name` (`queues`, `job_types`, `job_ids`): any sequence of `str`,
/// but not a `str` itself, which pyo3 would refuse with "Can't extract `str` to `Vec`" (naming
/// the argument only in a note). The message names the argument and, for a `str`, how to write
/// a list of one.
pub(crate) fn names_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<String>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a list of str, not a str: for one, write [{}]",
            s.repr().map(|r| r.to_string()).unwrap_or_default()
        )));
    }
    obj.extract::<Vec<String>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a list of str, not {}",
            type_name(obj)
        ))
    })
}

/// Reads argument `name` as an instance of the class `T` (`sepp.T`). pyo3's own message for a
/// wrong type ("'str' object is not an instance of 'Payload'") names neither the argument nor
/// what to pass.
///
/// # Errors
/// `TypeError`: `payload must be a sepp.Payload, not str`.
pub(crate) fn class_arg<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, T>> {
    match obj.cast::<T>() {
        Ok(b) => Ok(b.clone()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be a sepp.{}, not {}",
            class_name::<T>(obj.py()),
            type_name(obj)
        ))),
    }
}

/// The Python name of the class `T`, for messages.
fn class_name<T: pyo3::PyClass>(py: Python<'_>) -> String {
    <T as pyo3::PyTypeInfo>::type_object(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// [`class_arg`] for an optional argument: `None` when omitted or `None`.
pub(crate) fn opt_class_arg<'py, T: pyo3::PyClass>(
    obj: Option<&Bound<'py, PyAny>>,
    name: &str,
) -> PyResult<Option<Bound<'py, T>>> {
    match obj {
        Some(o) if !o.is_none() => class_arg(o, name).map(Some),
        _ => Ok(None),
    }
}

/// Reads argument `name` as a list (any iterable but a `str`) of `T`s; an item of another type
/// is named by its index (`requests[2] must be a sepp.EnqueueRequest, not dict`).
pub(crate) fn class_list_arg<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Vec<Bound<'py, T>>> {
    // The messages are built only on failure: this runs on every enqueue_batch call.
    let not_a_list = || {
        PyTypeError::new_err(format!(
            "{name} must be a list of sepp.{}, not {}",
            class_name::<T>(obj.py()),
            type_name(obj)
        ))
    };
    if obj.cast::<PyString>().is_ok() || obj.cast::<T>().is_ok() {
        return Err(not_a_list());
    }
    let items = obj.try_iter().map_err(|_| not_a_list())?;
    items
        .enumerate()
        .map(|(i, item)| {
            let item = item?;
            match item.cast::<T>() {
                Ok(b) => Ok(b.clone()),
                Err(_) => class_arg(&item, &format!("{name}[{i}]")),
            }
        })
        .collect()
}

/// [`names_arg`] for an optional argument: `None` when omitted or `None`.
pub(crate) fn opt_names_arg(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Option<Vec<String>>> {
    match obj {
        Some(o) if !o.is_none() => names_arg(o, name).map(Some),
        _ => Ok(None),
    }
}
