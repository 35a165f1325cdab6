//! How a core future becomes a Python coroutine.
//!
//! Each async method returns a real coroutine (so `asyncio.create_task` and task groups accept
//! it), and, like any coroutine, it does nothing until it runs: the core future is spawned on
//! the tokio runtime of pyo3-async-runtimes only when the coroutine first awaits. Arguments are
//! converted before that, when the method is called, so a wrong type fails at the call site.
//!
//! Cancelling the awaiting task cancels the asyncio future, which aborts the core future on the
//! runtime; a gRPC call in flight is then reset, so a cancelled reserve leases no job.
//!
//! `enqueue` is the exception ([`callback_coroutine`]): when its coroutine first awaits, it
//! hands the job to the core's coalescing queue from the loop's thread
//! (`SeppClient::enqueue_with`), and the batch that takes it answers through a callback, so a
//! call spawns no task. Cancelling it removes a job that has not left yet.
//!
//! Results go back to the event loops through one delivery thread: it takes every result that
//! is ready, attaches to the interpreter once for all of them, and wakes each loop once with
//! `loop.call_soon_threadsafe` (so many concurrent calls share one wake-up). Attaching happens
//! on that thread only, never on a runtime worker, which keeps the runtime's threads free while
//! the event loop holds the GIL. The thread keeps one Python thread state for its life
//! ([`keep_thread_state`]), so an attach only takes the GIL.
//!
//! Interpreter exit: `call_soon_threadsafe` releases the GIL while it wakes the loop, so the
//! main thread may finish and start finalizing meanwhile; a thread that attaches, or
//! re-attaches, during finalization crashes the process (an abort or a segfault at exit, seen
//! with pyo3-async-runtimes' own `future_into_py`, which also attached for cancelled calls).
//! Hence an `atexit` hook closes a gate ([`EXITING`]): it waits, with the GIL released, for the
//! delivery in progress, and nothing attaches after it. A cancelled call's result, if one
//! still comes, is dropped (`settle` skips a future that is done).

use crate::error::Failure;
use futures_util::FutureExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, RwLock};
use tokio::sync::oneshot;

/// Closed (`true`) by [`close_deliveries`] at interpreter exit. The delivery thread holds the read
/// side while it is attached to the interpreter; closing takes the write side.
static EXITING: RwLock<bool> = RwLock::new(false);

/// The `atexit` hook: waits for the delivery in progress, then lets no other one attach.
#[pyfunction]
pub(crate) fn close_deliveries(py: Python<'_>) {
    // The GIL is released while waiting: a delivery holding the gate may be waiting for it.
    py.detach(|| {
        *EXITING.write().unwrap_or_else(|e| e.into_inner()) = true;
    });
}

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

impl ToPython for usize {
    fn to_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        self.into_pyobject(py)
            .map(Bound::into_any)
            .map_err(Into::into)
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

type StartFn = Box<dyn for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> + Send>;

/// A call whose core future has not been started; `start` spawns it once and returns the
/// asyncio future of its result. Owned by the coroutine that awaits it: when that coroutine is
/// dropped unstarted, the core future is dropped unpolled and nothing is sent.
#[pyclass(module = "sepp._native", frozen)]
struct PendingCall {
    start: Mutex<Option<StartFn>>,
}

#[pymethods]
impl PendingCall {
    fn start<'py>(&self, event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let start = self
            .start
            .lock()
            .map_err(|_| PyRuntimeError::new_err("sepp call state poisoned"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this sepp call was already awaited"))?;
        start(event_loop)
    }
}

/// The done callback of a call's asyncio future: tells the core to give up the call (when the
/// result was set instead, the core is no longer listening).
#[pyclass(module = "sepp._native", frozen)]
struct AbortOnDone {
    abort: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl AbortOnDone {
    /// How to give the call up.
    fn set(&self, abort: Box<dyn FnOnce() + Send>) {
        if let Ok(mut g) = self.abort.lock() {
            *g = Some(abort);
        }
    }
}

#[pymethods]
impl AbortOnDone {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        if let Some(abort) = self.abort.lock().ok().and_then(|mut g| g.take()) {
            abort();
        }
    }
}

/// The Python helpers: `run(call)`, the coroutine that starts a [`PendingCall`] on the running
/// loop and awaits it, and `settle(results)`, which a loop calls with a batch of
/// `(future, ok, value)`.
fn helpers(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static HELPERS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    HELPERS
        .get_or_try_init(py, || {
            PyModule::from_code(
                py,
                c"import asyncio\n\
                  async def run(call):\n\
                  \x20   return await call.start(asyncio.get_running_loop())\n\
                  def settle(results):\n\
                  \x20   for future, ok, value in results:\n\
                  \x20       if not future.done():\n\
                  \x20           (future.set_result if ok else future.set_exception)(value)\n",
                c"<sepp._native>",
                c"sepp._native_call",
            )
            .map(Bound::unbind)
        })
        .map(|m| m.bind(py))
}

/// A coroutine that runs `fut` on the tokio runtime and returns its converted result.
pub(crate) fn coroutine<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: ToPython,
{
    pending(py, Box::new(move |event_loop| spawn_on(event_loop, fut)))
}

/// The coroutine that runs `start` on its loop when it first awaits, and awaits its future.
fn pending(py: Python<'_>, start: StartFn) -> PyResult<Bound<'_, PyAny>> {
    let pending = Bound::new(
        py,
        PendingCall {
            start: Mutex::new(Some(start)),
        },
    )?;
    helpers(py)?.getattr("run")?.call1((pending,))
}

/// Spawns `fut` and returns the asyncio future, on `event_loop`, of its result.
fn spawn_on<'py, F, T>(event_loop: &Bound<'py, PyAny>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: ToPython,
{
    let (abort_tx, abort_rx) = oneshot::channel::<()>();
    let (future, deliver, on_done) = awaited_on(event_loop)?;
    on_done.get().set(Box::new(move || {
        let _ = abort_tx.send(());
    }));
    pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
        // A dropped callback (the future collected unfinished) counts as a cancellation.
        let outcome = tokio::select! {
            outcome = AssertUnwindSafe(fut).catch_unwind() => outcome,
            _ = abort_rx => return,
        };
        match outcome {
            Ok(result) => deliver.result(result),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                deliver.value(Box::new(move |_| {
                    Err(PyRuntimeError::new_err(format!(
                        "sepp: the native call panicked: {message}"
                    )))
                }));
            }
        }
    });
    Ok(future)
}

/// A coroutine whose call answers through a callback instead of a future: when the coroutine
/// first awaits, `start` gets the callback ([`Deliver`], to call once, from any thread) and
/// returns how to give the call up (called when the asyncio future is cancelled). The enqueue
/// of a coalescing client is made so, without a task of its own (`SeppClient::enqueue_with`).
pub(crate) fn callback_coroutine<S>(py: Python<'_>, start: S) -> PyResult<Bound<'_, PyAny>>
where
    S: FnOnce(Deliver) -> Box<dyn FnOnce() + Send> + Send + 'static,
{
    let start: StartFn = Box::new(move |event_loop| {
        let (future, deliver, on_done) = awaited_on(event_loop)?;
        // Safe to set after the call started: the future is settled, or cancelled, only on
        // this loop's thread, which is busy here.
        on_done.get().set(start(deliver));
        Ok(future)
    });
    pending(py, start)
}

/// A new asyncio future on `event_loop`, the way to settle it from any thread, and its done
/// callback, which gives the call up once [`AbortOnDone::set`] told it how.
fn awaited_on<'py>(
    event_loop: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, Deliver, Bound<'py, AbortOnDone>)> {
    let py = event_loop.py();
    let sender = delivery_thread()?;
    let future = event_loop.call_method0("create_future")?;
    let on_done = Bound::new(
        py,
        AbortOnDone {
            abort: Mutex::new(None),
        },
    )?;
    future.call_method1("add_done_callback", (&on_done,))?;
    let deliver = Deliver {
        sender,
        event_loop: event_loop.clone().unbind(),
        future: future.clone().unbind(),
    };
    Ok((future, deliver, on_done))
}

/// Settles one call's asyncio future from any thread, through the delivery thread.
pub(crate) struct Deliver {
    sender: mpsc::Sender<Delivery>,
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
}

impl Deliver {
    /// Settles the future with a call's outcome.
    pub(crate) fn result<T: ToPython>(self, result: Result<T, Failure>) {
        self.value(Box::new(move |py| Reply(result).into_pyobject(py)));
    }

    fn value(self, value: ValueFn) {
        // Fails only once the delivery thread is gone; nobody could await the result then.
        let _ = self.sender.send(Delivery {
            event_loop: self.event_loop,
            future: self.future,
            value,
        });
    }
}

/// Builds a call's Python value, under the GIL on the delivery thread.
type ValueFn = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send>;

/// A result on its way to the event loop that awaits it.
struct Delivery {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
    value: ValueFn,
}

/// The sender to the delivery thread, which is started on first use and runs until the process
/// ends. Every spawned call holds a clone of the sender until it delivers.
fn delivery_thread() -> PyResult<mpsc::Sender<Delivery>> {
    static SENDER: OnceLock<Option<mpsc::Sender<Delivery>>> = OnceLock::new();
    SENDER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("sepp-deliver".into())
                .spawn(move || deliver(rx))
                .ok()
                .map(|_| tx)
        })
        .clone()
        .ok_or_else(|| PyRuntimeError::new_err("sepp could not start its delivery thread"))
}

/// The delivery thread: hands each batch of ready results to the loops awaiting them.
fn deliver(rx: mpsc::Receiver<Delivery>) {
    keep_thread_state();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let gate = EXITING.read().unwrap_or_else(|e| e.into_inner());
        if *gate {
            // The interpreter is exiting: nobody awaits these any more, and attaching could
            // crash. pyo3 keeps the references for later release (never, at exit).
            continue;
        }
        Python::attach(move |py| {
            if let Err(e) = settle_batch(py, batch) {
                e.print(py);
            }
        });
        drop(gate);
    }
}

/// Gives this thread a Python thread state for the rest of its life, without holding the GIL.
///
/// Without it, each attach of the delivery thread (one per batch of results) created a thread
/// state and its release destroyed it again, and with it the 16 KiB frame stack that CPython
/// maps for the thread's first call and unmaps when the state goes: an mmap and a munmap per
/// batch, and each munmap flushes the other cores' TLBs by interrupt. With one state held
/// here (the outer `PyGILState_Ensure` is never released), later attaches only take and drop
/// the GIL. Not done once the interpreter is exiting ([`EXITING`]).
fn keep_thread_state() {
    let gate = EXITING.read().unwrap_or_else(|e| e.into_inner());
    if *gate {
        return;
    }
    // SAFETY: the interpreter is initialized (this thread is started by a call from Python)
    // and not finalizing (the gate is open and held). `PyGILState_Ensure` attaches this
    // thread, creating its thread state; `PyEval_SaveThread` releases the GIL and keeps the
    // state, which stays this thread's until the process ends. pyo3 has not attached this
    // thread (it counts its own attaches), so its later `Python::attach` calls find the state
    // and only take the GIL.
    unsafe {
        let _ = pyo3::ffi::PyGILState_Ensure();
        let _ = pyo3::ffi::PyEval_SaveThread();
    }
    drop(gate);
}

/// Sets each result on its future, through one `call_soon_threadsafe` per event loop.
fn settle_batch(py: Python<'_>, batch: Vec<Delivery>) -> PyResult<()> {
    let settle = helpers(py)?.getattr("settle")?;
    let mut loops: Vec<(Py<PyAny>, Vec<Bound<'_, PyTuple>>)> = Vec::new();
    for d in batch {
        let (ok, value) = match (d.value)(py) {
            Ok(v) => (true, v),
            Err(e) => (false, e.into_value(py).into_bound(py).into_any()),
        };
        let item = PyTuple::new(
            py,
            [d.future.into_bound(py).into_any(), ok.to_python(py)?, value],
        )?;
        match loops
            .iter_mut()
            .find(|(l, _)| l.as_ptr() == d.event_loop.as_ptr())
        {
            Some((_, items)) => items.push(item),
            None => loops.push((d.event_loop, vec![item])),
        }
    }
    for (event_loop, items) in loops {
        // Fails when the loop is closed: then nobody awaits these results either.
        let _ = event_loop
            .bind(py)
            .call_method1("call_soon_threadsafe", (&settle, PyList::new(py, items)?));
    }
    Ok(())
}
