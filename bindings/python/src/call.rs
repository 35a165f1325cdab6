//! How a core future becomes a Python coroutine.
//!
//! Each async method returns a real coroutine (so `asyncio.create_task` and task groups accept
//! it), and, like any coroutine, it does nothing until it runs: the core future is handed to the
//! tokio runtime of pyo3-async-runtimes only when the coroutine first awaits. Arguments are
//! converted before that, when the method is called, so a wrong type fails at the call site.
//!
//! Cancelling the awaiting task cancels the asyncio future, which drops the core future on the
//! runtime; a gRPC call in flight is then reset, so a cancelled reserve leases no job.

use crate::error::Failure;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::future::Future;
use std::sync::Mutex;

/// Converts a core result to its Python value. Runs with the GIL held, when the result is
/// handed to the event loop.
pub(crate) trait ToPython: Send + 'static {
    /// The Python value.
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>>;
}

impl ToPython for () {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(py.None().into_bound(py))
    }
}

impl ToPython for bool {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(pyo3::types::PyBool::new(py, self).to_owned().into_any())
    }
}

impl ToPython for String {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(pyo3::types::PyString::new(py, &self).into_any())
    }
}

impl<T: ToPython> ToPython for Option<T> {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Some(t) => t.to_python(py),
            None => Ok(py.None().into_bound(py)),
        }
    }
}

impl<T: ToPython> ToPython for Vec<T> {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let items = self
            .into_iter()
            .map(|t| t.to_python(py))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(pyo3::types::PyList::new(py, items)?.into_any())
    }
}

impl<T: ToPython> ToPython for Result<T, sepp_rs::Rejection> {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Ok(t) => t.to_python(py),
            Err(r) => Ok(Bound::new(py, crate::error::Rejection::from_core(&r))?.into_any()),
        }
    }
}

/// The outcome of a call, converted under the GIL: a value, or the `sepp.errors` exception
/// that the awaiting coroutine raises.
struct Reply<T>(Result<T, Failure>);

impl<'py, T: ToPython> IntoPyObject<'py> for Reply<T> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.0 {
            Ok(t) => t.to_python(py),
            Err(f) => Err(f.into_pyerr(py)),
        }
    }
}

type StartFn = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send>;

/// A call whose core future has not been started; `start` hands it to the runtime once and
/// returns the asyncio future of its result. Owned by the coroutine that awaits it: when that
/// coroutine is dropped unstarted, the core future is dropped unpolled and nothing is sent.
#[pyclass(module = "sepp._native", frozen)]
struct PendingCall {
    start: Mutex<Option<StartFn>>,
}

#[pymethods]
impl PendingCall {
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let start = self
            .start
            .lock()
            .map_err(|_| PyRuntimeError::new_err("sepp call state poisoned"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this sepp call was already awaited"))?;
        start(py)
    }
}

/// The coroutine function `run(call)` that starts a [`PendingCall`] and awaits it.
fn runner(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static RUN: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    RUN.get_or_try_init(py, || {
        let module = PyModule::from_code(
            py,
            c"async def run(call):\n    return await call.start()\n",
            c"<sepp._native>",
            c"sepp._native_call",
        )?;
        module.getattr("run").map(Bound::unbind)
    })
    .map(|f| f.bind(py))
}

/// A coroutine that runs `fut` on the tokio runtime and returns its converted result.
pub(crate) fn coroutine<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: ToPython,
{
    let start: StartFn = Box::new(move |py| {
        pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(Reply(fut.await)) })
    });
    let pending = Bound::new(
        py,
        PendingCall {
            start: Mutex::new(Some(start)),
        },
    )?;
    runner(py)?.call1((pending,))
}
