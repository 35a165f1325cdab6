//! Undecodable requests to the services whose stubs are not generated here get
//! `INVALID_ARGUMENT`, as the sepp services answer (their stubs use `sepp_proto::codec`).
//!
//! tonic-health's stubs answer a health request that does not decode with `INTERNAL` (which
//! clients read as a server fault), and tonic-reflection ends the stream with `OK` and no
//! answer. [`DecodeChecked`] wraps such a service: every whole, uncompressed message of its
//! request body is decoded as the service's request type before the service sees it; at the
//! first that does not decode, the request body ends there (the service sees nothing more) and
//! the call's status, whatever the service then answers, is replaced with `INVALID_ARGUMENT`
//! naming the type and the decode error. Valid requests pass unchanged.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tonic::body::Body;

/// A service whose request messages must decode as `M`; see the module documentation.
pub(crate) struct DecodeChecked<S, M> {
    inner: S,
    /// Largest message checked, in bytes (the service's decode limit): a longer one is left to
    /// the service, which refuses it with `OUT_OF_RANGE` without reading it.
    limit: usize,
    _message: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for DecodeChecked<S, M> {
    fn clone(&self) -> Self {
        DecodeChecked {
            inner: self.inner.clone(),
            limit: self.limit,
            _message: PhantomData,
        }
    }
}

impl<S, M> DecodeChecked<S, M> {
    /// Wraps `inner`, whose requests are `M` messages of at most `limit` bytes.
    pub(crate) fn new(inner: S, limit: usize) -> Self {
        DecodeChecked {
            inner,
            limit,
            _message: PhantomData,
        }
    }
}

impl<S: tonic::server::NamedService, M> tonic::server::NamedService for DecodeChecked<S, M> {
    const NAME: &'static str = S::NAME;
}

/// The first decode failure of a call's request, shared by its request and response bodies.
type Failure = Arc<OnceLock<String>>;

impl<S, M> tower_service::Service<http::Request<Body>> for DecodeChecked<S, M>
where
    S: tower_service::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    M: prost::Message + Default + 'static,
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
        let failure: Failure = Arc::default();
        let req = req.map(|body| {
            Body::new(Checked::<M> {
                inner: body,
                limit: self.limit,
                pending: BytesMut::new(),
                skip: 0,
                failure: failure.clone(),
                _message: PhantomData,
            })
        });
        Box::pin(async move {
            let res = inner.call(req).await?;
            let (mut parts, body) = res.into_parts();
            if let Some(why) = failure.get() {
                // A trailers-only answer: the status is in the headers.
                if parts.headers.contains_key("grpc-status") {
                    replace_status(&mut parts.headers, why);
                }
            }
            let body = Body::new(Overridden {
                inner: body,
                failure,
            });
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

fn replace_status(headers: &mut http::HeaderMap, why: &str) {
    headers.remove("grpc-status-details-bin");
    // Only fails for a status whose details cannot be encoded; this one has none.
    let _ = tonic::Status::invalid_argument(why).add_header(headers);
}

/// The request body, checked message by message as it passes.
struct Checked<M> {
    inner: Body,
    limit: usize,
    /// The bytes of a message not yet whole (its 5-byte header first).
    pending: BytesMut,
    /// Bytes still to pass unchecked (a compressed message, or one above `limit`).
    skip: usize,
    failure: Failure,
    _message: PhantomData<fn() -> M>,
}

impl<M: prost::Message + Default> Checked<M> {
    /// Checks the messages `data` completes. At the first that does not decode, returns how
    /// many bytes of `data` come before it (the whole messages the service may still see).
    fn check(&mut self, data: &Bytes) -> Result<(), usize> {
        let mut rest = data.clone();
        // Where in `data` the message being read began (0 when it began in an earlier frame).
        let mut began = 0;
        loop {
            let at = data.len() - rest.len();
            if self.skip > 0 {
                if rest.is_empty() {
                    return Ok(());
                }
                let n = self.skip.min(rest.len());
                rest.advance(n);
                self.skip -= n;
                continue;
            }
            if self.pending.len() < 5 {
                if rest.is_empty() {
                    return Ok(());
                }
                if self.pending.is_empty() {
                    began = at;
                }
                let n = (5 - self.pending.len()).min(rest.len());
                self.pending.extend_from_slice(&rest.split_to(n));
                continue;
            }
            let h = &self.pending;
            let (compressed, len) = (h[0] != 0, u32::from_be_bytes([h[1], h[2], h[3], h[4]]));
            let len = len as usize;
            if compressed || len > self.limit {
                // Left to the service: it refuses both (no compression is enabled here).
                self.pending.clear();
                self.skip = len;
                continue;
            }
            let n = (len + 5 - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest.split_to(n));
            if self.pending.len() < len + 5 {
                return Ok(());
            }
            if let Err(e) = M::decode(&self.pending[5..]) {
                let name = std::any::type_name::<M>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("message");
                let _ = self
                    .failure
                    .set(format!("request body is not a valid {name}: {e}"));
                return Err(began);
            }
            self.pending.clear();
        }
    }
}

impl<M: prost::Message + Default> http_body::Body for Checked<M> {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if this.failure.get().is_some() {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref()
            && let Err(valid) = this.check(data)
        {
            // The whole messages before the bad one still reach the service; nothing after.
            return Poll::Ready((valid > 0).then(|| Ok(Frame::data(data.slice(..valid)))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failure.get().is_some() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The response body, whose final status becomes `INVALID_ARGUMENT` once the request failed
/// to decode.
struct Overridden {
    inner: Body,
    failure: Failure,
}

impl http_body::Body for Overridden {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                let Some(why) = this.failure.get() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                let mut trailers = frame.into_trailers().unwrap_or_default();
                replace_status(&mut trailers, why);
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
