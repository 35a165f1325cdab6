//! `sepp-rs`: the client core of sepp, a durable job queue with idempotent enqueue.
//!
//! It is the one copy of client logic: the Python and Node packages wrap it. It talks the
//! `sepp.v1` protocol and works against any server that speaks it.
//!
//! | module | holds |
//! |---|---|
//! | [`admin`] | operator calls: job and key lookup, dead-letter repair, pause/resume, stats |
//! | [`client`] | [`SeppClient`]: connect, enqueue, reserve, ack, nack, extend, ... |
//! | [`coalesce`] | concurrent enqueues of one client leave together as one `EnqueueBatch` |
//! | [`request`] | [`EnqueueRequest`] and its validation, [`ReserveOptions`], [`NackRetry`] |
//! | [`job`] | what the server returns: [`EnqueueAck`], [`Job`], dead letters, server info |
//! | [`retry`] | [`RetryPolicy`]: what is retried, only when safe |
//! | [`engine`] | poll-and-complete engine under every worker: reserve batches, auto-extend, shutdown |
//! | [`worker`] | the Rust [`Worker`]: handlers per job type, bounded concurrency |
//! | [`trace`] | trace propagation: the context sent at enqueue, the handler's span and its parent |
//! | [`error`] | per-operation errors, [`Rejection`], stable [`ErrorCode`]s |
//!
//! # Quickstart
//!
//! ```no_run
//! use sepp_rs::client::SeppClient;
//! use sepp_rs::EnqueueRequest;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = SeppClient::connect("http://127.0.0.1:50051").await?;
//! // The key names what the job is about: a retry of this enqueue is a dedup hit.
//! let request = EnqueueRequest::new("thumbnails", "resize")?
//!     .with_payload(br#"{"image":"cat.png"}"#.to_vec(), "application/json")
//!     .with_idempotency_key("resize-cat.png-v1");
//! let ack = client.enqueue(request).await?;
//! assert!(!ack.job_id.is_empty());
//! # Ok(()) }
//! ```

pub mod admin;
pub mod client;
pub mod coalesce;
pub mod engine;
pub mod error;
pub mod job;
pub mod request;
pub mod retry;
pub mod trace;
pub mod worker;

pub use client::SeppClient;
pub use coalesce::EnqueueHandle;
pub use error::{
    BatchError, ClientError, EnqueueError, ErrorCode, LeaseError, Rejection, RejectionFields,
    ReserveError,
};
pub use job::{
    DeadLetterCause, DeadLetterRecord, EnqueueAck, Job, Payload, ServerInfo, TraceContext, Value,
};
pub use request::{EnqueueRequest, NackRetry, ReserveOptions};
pub use retry::RetryPolicy;
pub use worker::{HandlerError, JobCtx, Worker};

/// The README's Rust examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeExamples;
