//! `sepp-python`: the native module `sepp._native` of the Python package `sepp`.
//!
//! It converts between Python and [`sepp_rs`] types and maps the core's errors to the
//! exception classes of `sepp.errors`; every rule (validation, retries, limits) stays in the
//! core. The public API is declared, with its docstrings, in `python/src/sepp/_native.pyi`.
//!
//! | module | holds |
//! |---|---|
//! | `admin` | what the operator calls return: `JobInfo`, `KeyRecord`, `DeadLetterPage`, `QueueStats` |
//! | `client` | `SeppClient`: connect, enqueue, reserve, ack, nack, extend, ..., operator calls |
//! | `engine` | the core's worker engine under `sepp.worker`: `EngineOptions`, `Engine`, `Lease`, `Outcome`, `WorkerReport` |
//! | `request` | what Python sends: `EnqueueRequest`, `Payload`, `TraceContext`, `NackRetry`, `RetryPolicy`, `TlsOptions` |
//! | `job` | what the server returns: `EnqueueAck`, `Job`, `DeadLetterRecord`, `ServerInfo` |
//! | `error` | the `Rejection` value and the mapping of core errors to `sepp.errors` |
//! | `call` | how a core future becomes a Python coroutine |
//! | `repr` | `__repr__` in Python's notation |
//! | `time` | `timedelta` / aware `datetime` conversions |

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

mod admin;
mod call;
mod client;
mod engine;
mod error;
mod job;
mod repr;
mod request;
mod time;

/// The module `sepp._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let codes: Vec<&'static str> = sepp_rs::ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    m.add("ERROR_CODES", PyTuple::new(py, codes)?)?;
    // The class of each code in `sepp.errors` (the core's table; a test checks the classes).
    let classes = PyDict::new(py);
    for code in sepp_rs::ErrorCode::ALL {
        classes.set_item(code.as_str(), code.class_name())?;
    }
    m.add("ERROR_CLASS_NAMES", classes)?;
    // Before the interpreter finalizes, stop runtime threads from attaching to it (see `call`).
    py.import("atexit")?
        .call_method1("register", (wrap_pyfunction!(call::close_deliveries, m)?,))?;
    m.add_class::<client::SeppClient>()?;
    m.add_class::<request::EnqueueRequest>()?;
    m.add_class::<request::Payload>()?;
    m.add_class::<request::TraceContext>()?;
    m.add_class::<request::NackRetry>()?;
    m.add_class::<request::RetryPolicy>()?;
    m.add_class::<request::TlsOptions>()?;
    m.add_class::<job::EnqueueAck>()?;
    m.add_class::<job::Job>()?;
    m.add_class::<job::DeadLetterRecord>()?;
    m.add_class::<job::ServerInfo>()?;
    m.add_class::<error::Rejection>()?;
    m.add_class::<admin::JobInfo>()?;
    m.add_class::<admin::KeyRecord>()?;
    m.add_class::<admin::DeadLetterPage>()?;
    m.add_class::<admin::QueueStats>()?;
    m.add_class::<engine::EngineOptions>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Lease>()?;
    m.add_class::<engine::Outcome>()?;
    m.add_class::<engine::WorkerReport>()?;
    Ok(())
}
