//! The connection layer: accepting, TLS, HTTP/2 and the limits that keep a client that never
//! finishes what it started from holding the server's memory or its connection slots.
//!
//! - At most `server.max_connections` connections are served; the next one is accepted only
//!   when a slot frees, so it waits in the listen backlog.
//! - A new connection has `server.handshake_timeout_ms` to finish TLS and send the HTTP/2
//!   preface and its first SETTINGS frame, else it is dropped.
//! - Each call is first admitted on its headers alone ([`AdmitFn`]: the gRPC edge checks the
//!   API key there), so a call that will be refused never gets a byte of its body buffered.
//! - Every request message of a unary call is read by `ConnService` chunk by chunk, under the
//!   same timeout and its path's size limit, before tonic sees it: tonic reserves the length a
//!   gRPC frame header announces, so a stream that announces 16 MiB and sends nothing would
//!   cost 16 MiB. Here it costs what it sent. The timeout runs from the request's headers to
//!   the end of its message, never over the handler (a Reserve may wait minutes).
//! - What those partly received messages hold is charged to one server-wide budget,
//!   `server.request_buffer_bytes` ([`RequestBudget`]), as it is buffered. A request that would
//!   pass it is answered at once with `RESOURCE_EXHAUSTED` before any handler runs (so a retry
//!   is always safe), and its bytes go back to the budget; so do a request's bytes once its
//!   message is handed on, or when its stream is reset, times out or its connection drops. A
//!   message that arrives whole in its first DATA frame (every small request) is handed on
//!   without being charged, so a full budget does not stop ordinary calls.
//! - A call whose request is a stream of messages (server reflection) is handed to its service
//!   as it arrives: the service reads its messages one by one under its own small decode
//!   limit (see [`crate::api::request_shape`]).
//! - A connection with no call in flight for `server.idle_timeout_ms` gets GOAWAY; if the
//!   peer does not let it close within the handshake timeout, it is dropped. HTTP/2 keepalive
//!   pings drop a peer that stopped answering.
//! - At shutdown the listener closes, every connection gets GOAWAY, calls in flight have
//!   `server.shutdown_grace_ms`, then every remaining connection is dropped.

use crate::config::Config;
use bytes::Bytes;
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The client preface (24 bytes) plus the 9-byte header of the SETTINGS frame that must follow.
const HANDSHAKE_BYTES: u64 = 24 + 9;
/// Largest header list of one request (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`).
pub const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// Longest wait for a keepalive ping's answer.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The transport limits, from `[server]` and `limits.max_message_bytes`.
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// `server.max_connections`.
    pub max_connections: usize,
    /// `server.max_concurrent_streams`.
    pub max_concurrent_streams: u32,
    /// `server.handshake_timeout_ms`.
    pub handshake_timeout: Duration,
    /// `server.idle_timeout_ms`.
    pub idle_timeout: Duration,
    /// `server.shutdown_grace_ms`.
    pub shutdown_grace: Duration,
    /// Initial HTTP/2 stream window, in bytes.
    pub stream_window: u32,
    /// Initial HTTP/2 connection window, in bytes.
    pub connection_window: u32,
    /// `server.request_buffer_bytes`.
    pub request_buffer_bytes: u64,
}

impl NetOptions {
    /// The options `config` sets. The stream window is one request message (the message limit
    /// plus its 5-byte frame header), at least 64 KiB and at most 1 MiB; the connection window
    /// is four stream windows.
    pub fn from_config(config: &Config) -> Self {
        let s = &config.server;
        let stream_window = config
            .limits
            .max_message_bytes
            .saturating_add(5)
            .clamp(65_535, 1 << 20) as u32;
        NetOptions {
            max_connections: s.max_connections as usize,
            max_concurrent_streams: s.max_concurrent_streams,
            handshake_timeout: Duration::from_millis(s.handshake_timeout_ms),
            idle_timeout: Duration::from_millis(s.idle_timeout_ms),
            shutdown_grace: Duration::from_millis(s.shutdown_grace_ms),
            stream_window,
            connection_window: stream_window * 4,
            request_buffer_bytes: s.request_buffer_bytes,
        }
    }

    fn keepalive_interval(&self) -> Duration {
        (self.idle_timeout / 2).min(Duration::from_secs(60))
    }
}

/// How the connection layer reads the request of a call on one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Largest request message, in bytes.
    pub max_message_bytes: usize,
    /// True when the request is a stream of messages: the body goes to the service as it
    /// arrives instead of being read in full first.
    pub streaming: bool,
}

/// Decides, from a call's headers and before any of its body is read, whether the call is
/// admitted (the gRPC edge checks the API key here; a refusal is the call's answer) and how
/// its request is read. See [`crate::api::request_shape`].
pub type AdmitFn =
    Arc<dyn Fn(&http::request::Parts) -> Result<RequestShape, tonic::Status> + Send + Sync>;

/// The server-wide budget of bytes held in partly received request messages
/// (`server.request_buffer_bytes`). Every connection charges it as it reads request messages;
/// each request's share goes back when the request's message is handed on, or when its
/// stream ends, is reset, times out or its connection is dropped.
#[derive(Debug)]
pub struct RequestBudget {
    limit: u64,
    held: AtomicU64,
    last_warned: Mutex<Option<Instant>>,
}

impl RequestBudget {
    /// A budget of `limit` bytes, none held.
    pub fn new(limit: u64) -> Self {
        RequestBudget {
            limit,
            held: AtomicU64::new(0),
            last_warned: Mutex::new(None),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    fn take(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    /// The answer to a request that cannot get budget; logged once per 10 s at most.
    fn refusal(&self) -> tonic::Status {
        let mut last = self.last_warned.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(
                request_buffer_bytes = self.limit,
                "partly received requests hold the whole request buffer budget; refusing requests that need more"
            );
            *last = Some(Instant::now());
        }
        tonic::Status::resource_exhausted(format!(
            "request not processed: partly received requests hold all of \
             server.request_buffer_bytes ({} bytes); retry later",
            self.limit
        ))
    }
}

/// One request's share of the [`RequestBudget`], returned when dropped.
struct Share<'a> {
    budget: &'a RequestBudget,
    bytes: u64,
}

impl Share<'_> {
    /// Grows the share to `total` bytes; false (and unchanged) when the budget cannot cover it.
    fn grow_to(&mut self, total: u64) -> bool {
        if total <= self.bytes {
            return true;
        }
        if !self.budget.take(total - self.bytes) {
            return false;
        }
        self.bytes = total;
        true
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Serves `routes` on `listener` until `shutdown` is cancelled, then shuts down as described
/// in the module documentation and returns when every connection is closed.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    routes: tonic::service::Routes,
    admit: AdmitFn,
    opts: NetOptions,
    shutdown: CancellationToken,
) {
    let budget = Arc::new(RequestBudget::new(opts.request_buffer_bytes));
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    let tracker = TaskTracker::new();
    let drop_all = CancellationToken::new();
    let mut last_warned = None::<Instant>;
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
        let tcp = tokio::select! {
            s = accept(&listener, &mut last_warned) => s,
            () = shutdown.cancelled() => break,
        };
        let conn = Conn {
            tls: tls.clone(),
            routes: routes.clone(),
            admit: admit.clone(),
            budget: budget.clone(),
            opts: opts.clone(),
            shutdown: shutdown.clone(),
            drop_all: drop_all.clone(),
        };
        tracker.spawn(async move {
            conn.run(tcp).await;
            drop(permit);
        });
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(opts.shutdown_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::info!(
            connections = tracker.len(),
            grace_ms = opts.shutdown_grace.as_millis() as u64,
            "shutdown grace period over: dropping the remaining connections"
        );
        drop_all.cancel();
        tracker.wait().await;
    }
}

/// Accepts one connection. An accept error (most often EMFILE: out of file descriptors) is
/// logged once per second at most and followed by a short pause, instead of being retried at
/// once in a busy loop while the connection waits in the backlog.
async fn accept(listener: &TcpListener, last_warned: &mut Option<Instant>) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // Small request/response messages: do not wait to coalesce them.
                let _ = stream.set_nodelay(true);
                return stream;
            }
            Err(e) => {
                if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(error = %e, "cannot accept a connection; pausing accepts");
                    *last_warned = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

struct Conn {
    tls: Option<TlsAcceptor>,
    routes: tonic::service::Routes,
    admit: AdmitFn,
    budget: Arc<RequestBudget>,
    opts: NetOptions,
    shutdown: CancellationToken,
    drop_all: CancellationToken,
}

impl Conn {
    async fn run(self, tcp: TcpStream) {
        let deadline = tokio::time::Instant::now() + self.opts.handshake_timeout;
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(acceptor) => {
                let tls = tokio::select! {
                    r = tokio::time::timeout_at(deadline, acceptor.accept(tcp)) => r,
                    () = self.drop_all.cancelled() => return,
                };
                match tls {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out; connection dropped");
                        return;
                    }
                }
            }
        };
        let received = Arc::new(AtomicU64::new(0));
        let io = Counted {
            inner: io,
            received: received.clone(),
        };
        let (in_flight, mut calls) = watch::channel(0usize);
        let service = ConnService {
            routes: self.routes.clone(),
            admit: self.admit.clone(),
            budget: self.budget.clone(),
            receive_timeout: self.opts.handshake_timeout,
            in_flight: Arc::new(in_flight),
        };
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(self.opts.stream_window)
            .initial_connection_window_size(self.opts.connection_window)
            .adaptive_window(false)
            .max_concurrent_streams(self.opts.max_concurrent_streams)
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            .keep_alive_interval(Some(self.opts.keepalive_interval()))
            .keep_alive_timeout(KEEPALIVE_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::pin!(conn);

        let idle_timeout = self.opts.idle_timeout;
        let idle = async move {
            loop {
                if *calls.borrow_and_update() == 0 {
                    tokio::select! {
                        () = tokio::time::sleep(idle_timeout) => return,
                        r = calls.changed() => if r.is_err() { std::future::pending::<()>().await },
                    }
                } else if calls.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::pin!(idle);
        let handshake = tokio::time::sleep_until(deadline);
        tokio::pin!(handshake);
        let drain = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(drain);
        let (mut handshake_checked, mut closing, mut draining) = (false, false, false);
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = &mut handshake, if !handshake_checked => {
                    handshake_checked = true;
                    if received.load(Ordering::Relaxed) < HANDSHAKE_BYTES {
                        tracing::debug!("no HTTP/2 preface within the handshake timeout; connection dropped");
                        return;
                    }
                }
                () = &mut idle, if !closing => {
                    tracing::debug!("idle connection: sending GOAWAY");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    draining = true;
                    drain.as_mut().reset(tokio::time::Instant::now() + self.opts.handshake_timeout);
                }
                () = self.shutdown.cancelled(), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = &mut drain, if draining => {
                    tracing::debug!("idle connection did not close after GOAWAY; dropped");
                    return;
                }
                () = self.drop_all.cancelled() => return,
            }
        }
    }
}

/// Counts the bytes read from the peer, so the handshake timeout can tell whether the preface
/// arrived.
struct Counted {
    inner: Box<dyn Io>,
    received: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.received.fetch_add(n, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// One connection's service: counts calls in flight (for the idle timeout) and reads each
/// unary request message in full, under the receive timeout, its path's limit and the request
/// buffer budget, before tonic.
#[derive(Clone)]
struct ConnService {
    routes: tonic::service::Routes,
    admit: AdmitFn,
    budget: Arc<RequestBudget>,
    receive_timeout: Duration,
    in_flight: Arc<watch::Sender<usize>>,
}

/// Marks one call in flight until dropped.
struct InFlight(Arc<watch::Sender<usize>>);

impl InFlight {
    fn new(tx: Arc<watch::Sender<usize>>) -> Self {
        tx.send_modify(|n| *n += 1);
        InFlight(tx)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

type Response = http::Response<tonic::body::Body>;

impl tower_service::Service<http::Request<Incoming>> for ConnService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The routes are always ready (an axum router); each call clones them.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Incoming>) -> Self::Future {
        let guard = InFlight::new(self.in_flight.clone());
        let mut routes = self.routes.clone();
        let (parts, body) = req.into_parts();
        let shape = match (self.admit)(&parts) {
            Ok(shape) => shape,
            Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
        };
        // Kept for a panic's log line (a clone of shared bytes, not a copy).
        let uri = parts.uri.clone();
        if shape.streaming {
            return Box::pin(answer_panics(uri, async move {
                let _guard = guard;
                let req = http::Request::from_parts(parts, tonic::body::Body::new(body));
                tower_service::Service::call(&mut routes, req).await
            }));
        }
        let budget = self.budget.clone();
        let timeout = self.receive_timeout;
        Box::pin(answer_panics(uri, async move {
            let _guard = guard;
            let read = read_message(body, shape.max_message_bytes, &budget);
            let message = match tokio::time::timeout(timeout, read).await {
                Ok(Ok(m)) => m,
                Ok(Err(status)) => return Ok(status.into_http()),
                Err(_) => {
                    return Ok(tonic::Status::deadline_exceeded(format!(
                        "request message not received within server.handshake_timeout_ms ({} ms)",
                        timeout.as_millis()
                    ))
                    .into_http());
                }
            };
            let body = tonic::body::Body::new(http_body_util::Full::new(message));
            tower_service::Service::call(&mut routes, http::Request::from_parts(parts, body)).await
        }))
    }
}

/// Runs a call's handler; a panic in it (a bug) is logged and answered `INTERNAL`, which
/// clients do not retry, instead of a reset stream, which they take for a transport failure
/// and retry into the same panic. The server's locks recover from poisoning, so it goes on.
async fn answer_panics(
    uri: http::Uri,
    call: impl Future<Output = Result<Response, Infallible>>,
) -> Result<Response, Infallible> {
    use futures_util::FutureExt as _;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(answer) => answer,
        Err(panic) => {
            let path = uri.path();
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            tracing::error!(
                path,
                panic = what,
                "a call's handler panicked (a bug): answered INTERNAL"
            );
            Ok(tonic::Status::internal(format!(
                "the server failed on this call ({path}): a bug, logged on the server"
            ))
            .into_http())
        }
    }
}

/// The message length announced by the 5-byte gRPC frame header that starts the
/// concatenation of `parts`, once all five bytes are there.
fn announced(parts: &[&[u8]]) -> Option<usize> {
    let mut h = parts.iter().flat_map(|p| p.iter()).skip(1).take(4).copied();
    let be = [h.next()?, h.next()?, h.next()?, h.next()?];
    Some(u32::from_be_bytes(be) as usize)
}

/// The refusal of a request message of `n` bytes (announced, or read so far) over `limit`.
fn too_large(n: usize, limit: usize) -> tonic::Status {
    tonic::Status::out_of_range(format!(
        "request message is {n} bytes, over the server's limit of {limit} bytes \
         (limits.max_message_bytes)"
    ))
}

/// A unary request body that ended: exactly the messages it holds, else `INVALID_ARGUMENT`
/// (a truncated or missing message is the caller's fault, where tonic would say `INTERNAL`).
fn ended(body: Bytes) -> Result<Bytes, tonic::Status> {
    match announced(&[&body]) {
        Some(n) if body.len() < n + 5 => Err(tonic::Status::invalid_argument(format!(
            "request body ends inside its message: {} of the {n} bytes its header announces",
            body.len() - 5
        ))),
        None if body.is_empty() => Err(tonic::Status::invalid_argument(
            "request body is empty: a unary call sends one message",
        )),
        None => Err(tonic::Status::invalid_argument(format!(
            "request body ends inside the 5-byte message header ({} bytes)",
            body.len()
        ))),
        _ => Ok(body),
    }
}

/// Reads a unary gRPC request body: the 5-byte frame header and the message it announces, at
/// most `limit` message bytes, charging what it buffers to `budget`.
///
/// - A message that arrives whole in the first DATA frame is handed on as it is, uncharged.
/// - Otherwise the chunks are copied into one buffer whose capacity is charged to the budget
///   before it grows (doubling, up to the announced length); when the budget cannot cover it,
///   the request is refused with `RESOURCE_EXHAUSTED` and its share returns.
/// - The message is handed on as soon as it is complete, without waiting for the end of the
///   stream (a unary request has one message).
/// - When the header announces more than `limit`, the call is refused at once with
///   `OUT_OF_RANGE` naming both sizes and the config key ([`too_large`]); nothing more is read
///   or buffered.
/// - A body that ends before its message is complete is `INVALID_ARGUMENT` ([`ended`]).
async fn read_message(
    mut body: Incoming,
    limit: usize,
    budget: &RequestBudget,
) -> Result<Bytes, tonic::Status> {
    let mut buf: Vec<u8> = Vec::new();
    let mut share = Share { budget, bytes: 0 };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| tonic::Status::cancelled(format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.is_empty() {
            match announced(&[&data]) {
                Some(n) if n > limit => return Err(too_large(n, limit)),
                Some(n) if data.len() == n + 5 => return Ok(data),
                _ if body.is_end_stream() => return ended(data),
                _ => {}
            }
        }
        let len = buf.len() + data.len();
        if len > limit.saturating_add(5) {
            return Err(too_large(len.saturating_sub(5), limit));
        }
        if len > buf.capacity() {
            let whole = announced(&[&buf, &data]).map_or(limit, |n| n.min(limit)) + 5;
            let capacity = len.max(buf.capacity().saturating_mul(2).min(whole));
            if !share.grow_to(capacity as u64) {
                return Err(budget.refusal());
            }
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&data);
        match announced(&[&buf]) {
            Some(n) if n > limit => return Err(too_large(n, limit)),
            Some(n) if buf.len() == n + 5 => return Ok(Bytes::from(buf)),
            _ => {}
        }
    }
    ended(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_is_answered_internal_naming_the_call() {
        let answer = answer_panics(
            http::Uri::from_static("/sepp.v1.QueueService/Reserve"),
            async {
                if "x".len() == 1 {
                    panic!("boom");
                }
                Ok(tonic::Status::ok("").into_http())
            },
        )
        .await
        .unwrap();
        let status = tonic::Status::from_header_map(answer.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status.message().contains("/sepp.v1.QueueService/Reserve"),
            "{}",
            status.message()
        );
        // A call that does not panic is answered as it answers.
        let fine = answer_panics(http::Uri::from_static("/x"), async {
            Ok(tonic::Status::not_found("no").into_http())
        })
        .await
        .unwrap();
        let status = tonic::Status::from_header_map(fine.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::NotFound);
    }
}
