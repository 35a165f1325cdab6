//! Core errors as JavaScript errors, and the bridge from a Rust future to a JavaScript Promise.
//!
//! A [`Failure`] is built on the tokio thread (it is `Send`) and turned into a JavaScript
//! value on the JavaScript thread, where the Promise is rejected with it:
//!
//! - [`Failure::Sepp`]: an `Error` with `code` (the core's stable code), `retryable` and the
//!   code's details (`limit`, `actual`, `queue`, `jobId`, ...). `js/errors.js` re-classes it.
//! - [`Failure::Type`]: a `TypeError` with code `ERR_INVALID_ARG_TYPE` naming the argument.
//! - [`Failure::Closed`]: an `Error` with code `ERR_SEPP_CLIENT_CLOSED` (the core has no
//!   closed state; see `SeppClient.close`).

use napi::bindgen_prelude::{JsObjectValue, JsValue, Object, PromiseRaw, ToNapiValue, Unknown};
use napi::{Env, JsTypeError, sys};
use sepp_rs::{
    BatchError, ClientError, EnqueueError, ErrorCode, LeaseError, Rejection, RejectionFields,
    ReserveError,
};
use std::future::Future;
use std::time::SystemTime;

/// `code` of the `TypeError` for a missing or mistyped argument: Node's own code for it.
const TYPE_ERROR_CODE: &str = "ERR_INVALID_ARG_TYPE";

/// `code` of the error for a call on a closed client.
const CLOSED_CODE: &str = "ERR_SEPP_CLIENT_CLOSED";

/// Why a call failed, in a form that can cross from the tokio thread to the JavaScript one.
#[derive(Debug)]
pub enum Failure {
    /// A missing or mistyped argument or field; the message names it.
    Type(String),
    /// The client was closed before the call.
    Closed,
    /// An error of the core, with its stable code.
    Sepp(SeppFailure),
}

/// A core error: its code, message, whether a retry may help, and the code's details.
#[derive(Debug)]
pub struct SeppFailure {
    code: ErrorCode,
    message: String,
    retryable: bool,
    details: Vec<(&'static str, Detail)>,
}

/// One detail property of an error.
#[derive(Debug)]
enum Detail {
    Text(String),
    Number(f64),
    List(Vec<String>),
    Time(SystemTime),
}

impl SeppFailure {
    /// A failure with `code` and no details, never retryable: a refusal before sending (the
    /// core's `Invalid` variants, or a value JavaScript can hold but the core's types cannot,
    /// such as a negative duration).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        SeppFailure {
            code,
            message: message.into(),
            retryable: false,
            details: Vec::new(),
        }
    }

    fn with(mut self, name: &'static str, detail: Detail) -> Self {
        self.details.push((name, detail));
        self
    }

    /// Builds the JavaScript `Error`: `message`, `code`, `retryable` and the details.
    fn to_js<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        let mut obj = env.create_error(napi::Error::from_reason(self.message.as_str()))?;
        obj.set_named_property("code", self.code.as_str())?;
        obj.set_named_property("retryable", self.retryable)?;
        for (name, detail) in &self.details {
            match detail {
                Detail::Text(s) => obj.set_named_property(name, s.as_str())?,
                Detail::Number(n) => obj.set_named_property(name, *n)?,
                Detail::List(l) => obj.set_named_property(name, l.clone())?,
                Detail::Time(t) => {
                    obj.set_named_property(name, crate::value::Date::from(*t))?;
                }
            }
        }
        Ok(obj)
    }
}

/// The options the core's checks name, as the core (and Rust and Python) spell them and as
/// JavaScript callers do.
const JS_NAMES: [(&str, &str); 6] = [
    ("lease_duration", "leaseDurationMs"),
    ("max_in_flight", "maxInFlight"),
    ("handler_timeout", "handlerTimeoutMs"),
    ("max_jobs", "maxJobs"),
    ("wait_timeout", "waitTimeoutMs"),
    ("max_batches_in_flight", "maxBatchesInFlight"),
];

/// A message of the core's own checks (which lead with the option's name) with that name as
/// JavaScript spells it: `maxInFlight is 0: ...`, not `max_in_flight is 0: ...`. Messages from
/// the server are left alone: they name the protocol's fields.
fn js_names(message: String) -> String {
    for (core, js) in JS_NAMES {
        if let Some(rest) = message.strip_prefix(core)
            && rest.starts_with(' ')
        {
            return format!("{js}{rest}");
        }
    }
    message
}

impl From<ClientError> for SeppFailure {
    fn from(e: ClientError) -> Self {
        let message = e.message().to_string();
        let mut f = SeppFailure {
            code: e.code(),
            // INVALID_CONFIG comes from the client's own checks only.
            message: if e.code() == ErrorCode::InvalidConfig {
                js_names(message)
            } else {
                message
            },
            retryable: e.is_retryable(),
            details: Vec::new(),
        };
        if let Some(g) = e.grpc_code() {
            f = f.with("grpcCode", Detail::Number(f64::from(g)));
        }
        f
    }
}

impl From<Rejection> for SeppFailure {
    fn from(r: Rejection) -> Self {
        let mut f = SeppFailure {
            code: r.code(),
            message: r.to_string(),
            retryable: r.is_transient(),
            details: Vec::new(),
        };
        // Destructured whole: a field added to the core's `RejectionFields` does not compile
        // here until it is handed on. Sizes become numbers (exact below 2^53).
        let RejectionFields {
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
        let details = [
            ("queue", queue.map(Detail::Text)),
            ("limit", limit.map(|n| Detail::Number(n as f64))),
            ("actual", actual.map(|n| Detail::Number(n as f64))),
            ("encoding", encoding.map(Detail::Text)),
            ("allowed", allowed.map(Detail::List)),
            ("jobType", job_type.map(Detail::Text)),
            ("key", key.map(Detail::Text)),
            (
                "horizonMs",
                horizon.map(|h| Detail::Number(h.as_secs_f64() * 1000.0)),
            ),
            ("scheduledAt", scheduled_at.map(Detail::Time)),
            ("originalJobId", original_job_id.map(Detail::Text)),
            // The name this property had before `scheduledAt` (deprecated).
            ("actual", scheduled_at.map(Detail::Time)),
        ];
        for (name, detail) in details {
            if let Some(d) = detail {
                f = f.with(name, d);
            }
        }
        f
    }
}

impl From<EnqueueError> for SeppFailure {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::Rejected(r) => r.into(),
            EnqueueError::Client(c) => c.into(),
        }
    }
}

impl From<BatchError> for SeppFailure {
    fn from(e: BatchError) -> Self {
        let code = e.code();
        match e {
            BatchError::Invalid(m) => SeppFailure::new(code, js_names(m)),
            BatchError::Client(c) => c.into(),
        }
    }
}

impl From<LeaseError> for SeppFailure {
    fn from(e: LeaseError) -> Self {
        let code = e.code();
        match e {
            // The server's message already names the job; `jobId` carries it as data.
            LeaseError::NotInFlight { job_id, message }
            | LeaseError::AttemptMismatch { job_id, message } => {
                SeppFailure::new(code, message).with("jobId", Detail::Text(job_id))
            }
            LeaseError::Invalid(m) => SeppFailure::new(code, js_names(m)),
            LeaseError::Client(c) => c.into(),
        }
    }
}

impl From<ReserveError> for SeppFailure {
    fn from(e: ReserveError) -> Self {
        let code = e.code();
        match e {
            ReserveError::Invalid(m) => SeppFailure::new(code, js_names(m)),
            ReserveError::Client(c) => c.into(),
        }
    }
}

impl<E: Into<SeppFailure>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Sepp(e.into())
    }
}

impl ToNapiValue for Failure {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let js_env = Env::from_raw(env);
        match val {
            Failure::Type(message) => {
                let error = napi::Error::new(TYPE_ERROR_CODE, message);
                // SAFETY: `env` is the live environment this conversion was called with.
                Ok(unsafe { JsTypeError::from(error).into_value(env) })
            }
            Failure::Closed => {
                let mut obj = js_env.create_error(napi::Error::from_reason(
                    "the client is closed: connect a new one",
                ))?;
                obj.set_named_property("code", CLOSED_CODE)?;
                Ok(obj.raw())
            }
            Failure::Sepp(f) => Ok(f.to_js(&js_env)?.raw()),
        }
    }
}

/// Runs `work` on the addon's tokio runtime and returns a Promise of its result, converted by
/// `to_js` on the JavaScript thread; a [`Failure`] rejects the Promise with the JavaScript
/// error built from it.
///
/// The Promise keeps the Node event loop alive only while `work` runs: an idle client holds
/// no handle, so a process with an open client still exits when its work is done.
pub fn settle<'env, T, V>(
    env: &'env Env,
    work: impl Future<Output = Result<T, Failure>> + Send + 'static,
    to_js: impl FnOnce(T) -> V + 'static,
) -> napi::Result<PromiseRaw<'env, V>>
where
    T: Send + 'static,
    V: ToNapiValue,
{
    env.spawn_future_with_callback(
        async move { Ok(work.await) },
        move |env, outcome| match outcome {
            Ok(value) => Ok(to_js(value)),
            Err(failure) => Err(rejection(env, failure)),
        },
    )
}

/// The answer of a call made by [`settle_with`]: called once, from any thread.
pub type Answer<T> = Box<dyn FnOnce(Result<T, Failure>) + Send>;

/// Like [`settle`], for work that answers through a callback instead of a future (the enqueue
/// of a coalescing client, `SeppClient::enqueue_with`): `start` gets the callback and starts
/// the work, and no task is spawned for the call. The Promise settles on the JavaScript
/// thread, as with `settle`.
pub fn settle_with<'env, T, V>(
    env: &'env Env,
    start: impl FnOnce(Answer<T>),
    to_js: impl FnOnce(T) -> V + Send + 'static,
) -> napi::Result<PromiseRaw<'env, V>>
where
    T: Send + 'static,
    V: ToNapiValue + 'static,
{
    type Resolver<V> = Box<dyn FnOnce(Env) -> napi::Result<V> + Send>;
    let (deferred, promise) = env.create_deferred::<V, Resolver<V>>()?;
    start(Box::new(move |outcome| {
        let resolve: Resolver<V> = match outcome {
            Ok(value) => Box::new(move |_| Ok(to_js(value))),
            Err(failure) => Box::new(move |env| Err(rejection(&env, failure))),
        };
        deferred.resolve(resolve);
    }));
    Ok(PromiseRaw::new(env.raw(), promise.raw()))
}

/// The JavaScript error for `failure`, as the `napi::Error` that rejects a Promise with it (or,
/// returned from a synchronous call, is thrown).
pub(crate) fn rejection(env: &Env, failure: Failure) -> napi::Error {
    // SAFETY: runs on the JavaScript thread with the live `env` of the Promise's callback.
    match unsafe { Failure::to_napi_value(env.raw(), failure) } {
        Ok(raw) => {
            // SAFETY: `raw` was just created in `env`.
            let value = unsafe { Unknown::from_raw_unchecked(env.raw(), raw) };
            // Holds a reference to the JavaScript error, which the Promise is rejected with.
            napi::Error::from(value)
        }
        Err(e) => e,
    }
}
