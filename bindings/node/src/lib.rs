//! `sepp-node`: the native module under the npm package `sepp` (`js/`).
//!
//! It converts JavaScript values to the types of the `sepp-rs` core and back, and maps the
//! core's errors to JavaScript errors. Every rule (validation, retries, what is safe to
//! resend) is the core's; nothing here decides anything about jobs.
//!
//! | module | holds |
//! |---|---|
//! | [`client`] | [`SeppClient`](client::SeppClient): one method per core call, each returning a Promise |
//! | [`admin`] | the operator calls of `SeppClient` (job inspection, dead letters, pause, stats) |
//! | [`engine`] | [`Engine`](engine::Engine) and [`Lease`](engine::Lease): the core's worker engine, under `worker.js` |
//! | [`request`] | what JavaScript sends: [`EnqueueRequest`](request::EnqueueRequest), reserve, nack and connect options |
//! | [`job`] | what JavaScript gets back: acks, batch results, jobs, dead letters, server info |
//! | [`read`] | reading untyped arguments: the `TypeError` for a missing or mistyped field |
//! | [`value`] | scalars: milliseconds, integers, `Date`, custom values |
//! | [`error`] | core errors as JavaScript errors (`code` + details) and the Promise bridge |
//!
//! Doc comments on `#[napi]` items become the JSDoc of the generated `js/index.d.ts`.
//!
//! How errors reach JavaScript: a core error becomes an `Error` whose `code` is the core's
//! stable SCREAMING_SNAKE code, with that code's details as properties (`limit`, `actual`,
//! `queue`, ...); `js/errors.js` turns it into the matching `SeppError` subclass. A missing or
//! mistyped argument becomes a `TypeError` with code `ERR_INVALID_ARG_TYPE`. Both arrive as a
//! rejected Promise, never as a synchronous throw.

pub mod client;
// After `client`: the generated declarations list methods in module order, and the core has
// the operator calls after the queue calls.
pub mod admin;
// After the client's calls: the worker engine over them.
pub mod engine;

pub mod error;
pub mod job;
pub mod read;
pub mod request;
pub mod value;

use napi_derive::napi;

/// Every stable error code of the core (`ErrorCode::ALL`), e.g. `"IDEMPOTENCY_KEY_TOO_LONG"`.
/// `errors.js` has one `SeppError` subclass per code; a test checks that none is missing.
#[napi(ts_return_type = "ErrorCode[]")]
pub fn error_codes() -> Vec<&'static str> {
    sepp_rs::ErrorCode::ALL.iter().map(|c| c.as_str()).collect()
}

/// The name of each code's `SeppError` subclass, by code: the code in PascalCase followed by
/// `Error` (`IDEMPOTENCY_KEY_TOO_LONG` → `"IdempotencyKeyTooLongError"`), the same name as the
/// Python class. A test checks `errors.js` against it.
#[napi(ts_return_type = "Record<ErrorCode, string>")]
pub fn error_class_names() -> std::collections::HashMap<&'static str, &'static str> {
    sepp_rs::ErrorCode::ALL
        .iter()
        .map(|c| (c.as_str(), c.class_name()))
        .collect()
}
