//! Request duration per RPC and status code, for the metrics (`crate::metrics`): [`Timed`]
//! wraps a gRPC service and times each call from its request to its reply's headers (the
//! whole handler for a unary call; a Reserve's wait included).
//!
//! The status is the `grpc-status` of a trailers-only reply (every error a handler returns),
//! else `OK`. The `rpc` label is the method name; a path the service does not know (answered
//! `UNIMPLEMENTED`) is counted as `rpc="unknown"`, so clients cannot grow the label set.

use crate::metrics::Metrics;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::body::Body;

/// gRPC status names by code number.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A gRPC service whose calls are timed into [`Metrics`]; see the module documentation.
#[derive(Clone)]
pub(crate) struct Timed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Timed<S> {
    pub(crate) fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Timed { inner, metrics }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Timed<S> {
    const NAME: &'static str = S::NAME;
}

fn code_name(headers: &http::HeaderMap) -> &'static str {
    match headers.get("grpc-status") {
        None => "OK",
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .and_then(|i| CODES.get(i).copied())
            .unwrap_or("UNKNOWN"),
    }
}

impl<S> tower_service::Service<http::Request<Body>> for Timed<S>
where
    S: tower_service::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The clone is the one made ready by `poll_ready`; keep it and leave the fresh one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.metrics.enabled() {
            return Box::pin(inner.call(req));
        }
        let metrics = self.metrics.clone();
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let started = Instant::now();
        Box::pin(async move {
            let res = inner.call(req).await?;
            let code = code_name(res.headers());
            let rpc = if code == "UNIMPLEMENTED" {
                "unknown".to_string()
            } else {
                method
            };
            metrics.rpc(rpc, code, started.elapsed());
            Ok(res)
        })
    }
}
