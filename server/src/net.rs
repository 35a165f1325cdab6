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
//! - What replies hold between their handler and their connection's socket (a client that
//!   does not read its answers, or does not open its HTTP/2 flow-control window, leaves them
//!   there) is charged to a second budget, `server.reply_buffer_bytes` ([`ReplyBudget`]): each
//!   chunk of a reply is charged when the reply's body yields it and returned as HTTP/2 writes
//!   it out or drops it (`ReplyChunk`). While the replies of all connections hold the whole
//!   budget, or one connection's hold its share (an eighth of the budget, at least one
//!   largest message), calls that can answer with large replies are refused with
//!   `RESOURCE_EXHAUSTED` before their handler runs; calls with small replies (enqueues, Ack,
//!   Nack, Extend, GetServerInfo, health) go on. A call that only reads ([`Reply::Reads`]:
//!   GetJob, the admin lists) is also checked after it ran, its reply encoded at once: a reply
//!   that would take its connection past its share or the server past the budget is dropped
//!   and the call answered `RESOURCE_EXHAUSTED`, so many such calls sent at once cannot pass
//!   it together. A call that leases (Reserve, an Ack's `then_reserve`) gets a room
//!   (`CallRoom`, a [`crate::queue::reserve::ReplyRoom`]) from which each job's reply bytes
//!   are taken as it is leased: what does not fit is not leased. Other calls that change
//!   state (DrainDeadLetters, admin writes) always get their reply once they ran: those can
//!   pass the budget by what they answer (distinct records, each removed once), never by new
//!   calls.
//! - A call whose request is a stream of messages (server reflection) is handed to its service
//!   as it arrives: the service reads its messages one by one under its own small decode
//!   limit (see [`crate::api::request_shape`]).
//! - A connection whose replies hold bytes of which none was written for
//!   `server.reply_stall_timeout_ms` is dropped: its client does not read them, and the
//!   budget they hold goes back (an idle timeout would not do: the client can keep a call in
//!   flight).
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
    /// `server.reply_buffer_bytes`.
    pub reply_buffer_bytes: u64,
    /// `server.reply_stall_timeout_ms`.
    pub reply_stall_timeout: Duration,
    /// A connection's share of `reply_buffer_bytes`: an eighth of it, at least one largest
    /// message with its header (and at most the whole budget).
    pub connection_reply_bytes: u64,
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
            reply_buffer_bytes: s.reply_buffer_bytes,
            reply_stall_timeout: Duration::from_millis(s.reply_stall_timeout_ms),
            connection_reply_bytes: (s.reply_buffer_bytes / 8)
                .max(config.limits.max_message_bytes.saturating_add(5))
                .min(s.reply_buffer_bytes),
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
    /// What its reply can be, for `server.reply_buffer_bytes`.
    pub reply: Reply,
    /// True when the call leases jobs into its reply (Reserve, an Ack with `then_reserve`):
    /// it gets a [`crate::queue::reserve::ReplyRoom`] in its request's extensions, and leases
    /// only what fits in the connection's share and the budget.
    pub leases: bool,
}

/// What a call's reply can be, for `server.reply_buffer_bytes` ([`ReplyBudget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Always small (ids, an acknowledgement, a few settings): never held back.
    Small,
    /// Can be large, from a call that changes state (Reserve leases, DrainDeadLetters
    /// removes): refused before its handler runs while the budget is held, and its reply
    /// always sent once it ran, since refusing it then would hide what the call did.
    Writes,
    /// Can be large, from a call that only reads: refused before its handler runs while the
    /// budget is held, and after it ran when its reply would take its connection past its
    /// share or the server past the budget (nothing changed, so a retry is safe). Many such
    /// calls sent at once cannot pass the budget together.
    Reads,
}

/// Decides, from a call's headers and before any of its body is read, whether the call is
/// admitted (the gRPC edge checks the API key here; a refusal is the call's answer) and how
/// its request is read. See [`crate::api::request_shape`].
pub type AdmitFn =
    Arc<dyn Fn(&http::request::Parts) -> Result<RequestShape, tonic::Status> + Send + Sync>;

/// What each byte budget keeps besides its limit: the bytes held, the calls refused, and when
/// a refusal was last logged.
#[derive(Debug, Default)]
struct Tally {
    held: AtomicU64,
    refused: AtomicU64,
    last_warned: Mutex<Option<Instant>>,
}

impl Tally {
    fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Counts a refusal, and runs `log` if none was logged in the last 10 s.
    fn refuse(&self, log: impl FnOnce()) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_warned.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            log();
            *last = Some(Instant::now());
        }
    }
}

/// The server-wide budget of bytes held in partly received request messages
/// (`server.request_buffer_bytes`). Every connection charges it as it reads request messages;
/// each request's share goes back when the request's message is handed on, or when its
/// stream ends, is reset, times out or its connection is dropped.
#[derive(Debug)]
pub struct RequestBudget {
    limit: u64,
    tally: Tally,
}

impl RequestBudget {
    /// A budget of `limit` bytes, none held.
    pub fn new(limit: u64) -> Self {
        RequestBudget {
            limit,
            tally: Tally::default(),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.tally.held()
    }

    /// Requests refused for want of budget since the server started.
    pub fn refused(&self) -> u64 {
        self.tally.refused()
    }

    fn take(&self, n: u64) -> bool {
        self.tally
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    /// The answer to a request that cannot get budget; logged once per 10 s at most.
    fn refusal(&self) -> tonic::Status {
        self.tally.refuse(|| {
            tracing::warn!(
                request_buffer_bytes = self.limit,
                "partly received requests hold the whole request buffer budget; refusing requests that need more"
            );
        });
        tonic::Status::resource_exhausted(format!(
            "request not processed: partly received requests hold all of \
             server.request_buffer_bytes ({} bytes); retry later",
            self.limit
        ))
    }
}

/// The server-wide budget of reply bytes produced and not yet written to their connections
/// (`server.reply_buffer_bytes`), and each connection's share of it. See the module
/// documentation.
#[derive(Debug)]
pub struct ReplyBudget {
    limit: u64,
    per_connection: u64,
    tally: Tally,
}

impl ReplyBudget {
    /// A budget of `limit` bytes of which one connection may hold `per_connection`; none held.
    pub fn new(limit: u64, per_connection: u64) -> Self {
        ReplyBudget {
            limit,
            per_connection,
            tally: Tally::default(),
        }
    }

    /// Bytes held now, by every connection together.
    pub fn held(&self) -> u64 {
        self.tally.held()
    }

    /// Calls refused (before or after they ran) for want of budget since the server started.
    pub fn refused(&self) -> u64 {
        self.tally.refused()
    }

    /// The refusal of a call whose reply could be large while unread replies hold the
    /// budget (`connection`: this connection's own share); logged once per 10 s at most.
    fn refusal(&self, connection: Option<u64>) -> tonic::Status {
        self.tally.refuse(|| {
            tracing::warn!(
                reply_buffer_bytes = self.limit,
                held = self.held(),
                connection_held = connection,
                "unread replies hold the reply buffer budget; refusing calls that can answer with large replies"
            );
        });
        let message = match connection {
            Some(held) => format!(
                "call not processed: this connection has {held} bytes of replies it has not \
                 read, past its share of server.reply_buffer_bytes ({} of {} bytes); read them \
                 or retry later",
                self.per_connection, self.limit
            ),
            None => format!(
                "call not processed: unread replies hold all of server.reply_buffer_bytes \
                 ({} bytes); retry later",
                self.limit
            ),
        };
        tonic::Status::resource_exhausted(message)
    }
}

/// One connection's replies held unsent, charged to the server's [`ReplyBudget`] too.
#[derive(Debug)]
struct ConnReplies {
    budget: Arc<ReplyBudget>,
    held: AtomicU64,
    /// Leases waiting for this connection's replies to be written ([`CallRoom`]'s `freed`).
    freed: tokio::sync::Notify,
    waiting: std::sync::atomic::AtomicUsize,
    /// When bytes were last written out, or began to be held while none were: in ms since
    /// `epoch` ([`ConnReplies::stalled_for`]).
    progress_ms: AtomicU64,
    epoch: Instant,
}

impl ConnReplies {
    fn new(budget: Arc<ReplyBudget>) -> Self {
        ConnReplies {
            budget,
            held: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            progress_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// How long this connection has held reply bytes without writing any, if it holds some.
    fn stalled_for(&self) -> Option<Duration> {
        if self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since = self.progress_ms.load(Ordering::Acquire);
        Some(Duration::from_millis(self.now_ms().saturating_sub(since)))
    }

    /// Charges `n` bytes to this connection and the budget; returns what each held before.
    /// Bytes held from nothing start the stall clock ([`ConnReplies::stalled_for`]).
    fn charge(&self, n: u64) -> (u64, u64) {
        let own = self.held.fetch_add(n, Ordering::AcqRel);
        let all = self.budget.tally.held.fetch_add(n, Ordering::AcqRel);
        if own == 0 {
            self.progress_ms.store(self.now_ms(), Ordering::Release);
        }
        (own, all)
    }

    /// Returns `n` bytes that were written out or dropped, and wakes the leases waiting for
    /// room on this connection.
    fn release(&self, n: u64) {
        self.uncharge(n);
        if n > 0 {
            self.progress_ms.store(self.now_ms(), Ordering::Release);
            if self.waiting.load(Ordering::Acquire) > 0 {
                self.freed.notify_waiters();
            }
        }
    }

    /// Takes back a charge that did not fit (nothing was freed: nobody is woken).
    fn uncharge(&self, n: u64) {
        self.held.fetch_sub(n, Ordering::AcqRel);
        self.budget.tally.held.fetch_sub(n, Ordering::AcqRel);
    }

    /// Charges `n` bytes unless they take this connection past its share or the server past
    /// the budget (the first bytes always fit: a share holds one largest message). When they
    /// do not fit nothing stays charged, and the error holds what the connection and the
    /// budget held.
    fn fits(&self, n: u64) -> Result<(), (u64, u64)> {
        let (own, all) = self.charge(n);
        let b = &self.budget;
        if (own > 0 && own + n > b.per_connection) || (all > 0 && all + n > b.limit) {
            self.uncharge(n);
            return Err((own, all));
        }
        Ok(())
    }

    /// [`ConnReplies::fits`] for a whole reply; the refusal names the sizes.
    fn try_charge(&self, n: u64) -> Result<(), tonic::Status> {
        let b = &self.budget;
        if let Err((own, all)) = self.fits(n) {
            b.tally.refused.fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::resource_exhausted(format!(
                "reply not sent: its {n} bytes would take unread replies past \
                 server.reply_buffer_bytes (this connection holds {own} of its {} bytes, all \
                 connections {all} of {}); the call only reads, retry later",
                b.per_connection, b.limit
            )));
        }
        Ok(())
    }

    /// The answer of a call, its reply encoded and charged now. With `refuse` (a call that
    /// only reads, [`Reply::Reads`]), a reply that does not fit ([`ConnReplies::try_charge`])
    /// is dropped and the call answered `RESOURCE_EXHAUSTED` instead; without, it is charged
    /// whatever it holds (a lease's reply, whose bytes its room already took).
    async fn checked(self: Arc<Self>, response: Response, refuse: bool) -> Answer {
        let (parts, mut inner) = response.into_parts();
        let wrap = |bytes: Bytes| ReplyChunk {
            bytes,
            conn: self.clone(),
        };
        let first = match inner.frame().await {
            None => None,
            Some(Err(status)) => Some(Err(status)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(bytes) if !refuse => {
                    self.charge(bytes.len() as u64);
                    Some(Ok(http_body::Frame::data(wrap(bytes))))
                }
                Ok(bytes) => match self.try_charge(bytes.len() as u64) {
                    Ok(()) => Some(Ok(http_body::Frame::data(wrap(bytes)))),
                    Err(status) => {
                        return status.into_http().map(|inner| HeldReply {
                            first: None,
                            inner,
                            conn: self.clone(),
                        });
                    }
                },
                Err(other) => Some(Ok(other.map_data(wrap))),
            },
        };
        http::Response::from_parts(
            parts,
            HeldReply {
                first,
                inner,
                conn: self.clone(),
            },
        )
    }

    /// Whether a call with a possibly large reply may start on this connection now.
    fn admit(&self) -> Result<(), tonic::Status> {
        let own = self.held.load(Ordering::Acquire);
        if own >= self.budget.per_connection {
            return Err(self.budget.refusal(Some(own)));
        }
        if self.budget.held() >= self.budget.limit {
            return Err(self.budget.refusal(None));
        }
        Ok(())
    }
}

/// The [`crate::queue::reserve::ReplyRoom`] of one leasing call on a connection: what its
/// leases take is charged to the connection's replies until the call's reply is made and
/// charged itself, then given back (on drop).
struct CallRoom {
    conn: Arc<ConnReplies>,
    taken: AtomicU64,
}

impl crate::queue::reserve::ReplyRoom for CallRoom {
    fn try_take(&self, bytes: u64) -> bool {
        if self.conn.fits(bytes).is_err() {
            return false;
        }
        self.taken.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn freed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        /// Counts a waiter from before its notification is registered until it ends.
        struct Waiter<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiter<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let conn = &self.conn;
        conn.waiting.fetch_add(1, Ordering::AcqRel);
        let waiter = Waiter(&conn.waiting);
        // Registered now: a write after this call wakes it, even before it is polled.
        let notified = conn.freed.notified();
        Box::pin(async move {
            let _waiter = waiter;
            notified.await;
        })
    }
}

impl Drop for CallRoom {
    fn drop(&mut self) {
        self.conn.release(*self.taken.get_mut());
    }
}

/// A call's reply body: tonic's, whose data chunks become [`ReplyChunk`]s charged to the
/// connection's replies.
struct HeldReply {
    /// A frame taken (and charged) before the answer was handed on ([`ConnReplies::checked`]).
    first: Option<Result<http_body::Frame<ReplyChunk>, tonic::Status>>,
    inner: tonic::body::Body,
    conn: Arc<ConnReplies>,
}

impl http_body::Body for HeldReply {
    type Data = ReplyChunk;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<ReplyChunk>, tonic::Status>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(first));
        }
        Pin::new(&mut this.inner).poll_frame(cx).map(|f| {
            f.map(|f| {
                f.map(|f| {
                    f.map_data(|bytes| {
                        this.conn.charge(bytes.len() as u64);
                        ReplyChunk {
                            bytes,
                            conn: this.conn.clone(),
                        }
                    })
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.first.is_some() {
            return http_body::SizeHint::default();
        }
        self.inner.size_hint()
    }
}

/// A chunk of a reply, charged to its connection's [`ConnReplies`] until HTTP/2 has written
/// it (each byte is returned as it is consumed) or dropped it.
struct ReplyChunk {
    bytes: Bytes,
    conn: Arc<ConnReplies>,
}

impl bytes::Buf for ReplyChunk {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
        self.conn.release(cnt as u64);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let out = self.bytes.split_to(len);
        self.conn.release(len as u64);
        out
    }
}

impl Drop for ReplyChunk {
    fn drop(&mut self) {
        self.conn.release(self.bytes.len() as u64);
    }
}

/// The connection layer's two server-wide byte budgets, made before [`serve`] so that the
/// metrics scrape can read them.
#[derive(Debug, Clone)]
pub struct Budgets {
    /// `server.request_buffer_bytes`.
    pub request: Arc<RequestBudget>,
    /// `server.reply_buffer_bytes`.
    pub reply: Arc<ReplyBudget>,
}

impl Budgets {
    /// The budgets `opts` sets, nothing held.
    pub fn new(opts: &NetOptions) -> Self {
        Budgets {
            request: Arc::new(RequestBudget::new(opts.request_buffer_bytes)),
            reply: Arc::new(ReplyBudget::new(
                opts.reply_buffer_bytes,
                opts.connection_reply_bytes,
            )),
        }
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
        self.budget
            .tally
            .held
            .fetch_sub(self.bytes, Ordering::AcqRel);
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
    budgets: Budgets,
    shutdown: CancellationToken,
) {
    let Budgets {
        request: budget,
        reply: replies,
    } = budgets;
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
            replies: replies.clone(),
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
    replies: Arc<ReplyBudget>,
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
        let activity = Arc::new(Activity::new());
        let replies = Arc::new(ConnReplies::new(self.replies.clone()));
        let service = ConnService {
            routes: self.routes.clone(),
            admit: self.admit.clone(),
            budget: self.budget.clone(),
            replies: replies.clone(),
            receive_timeout: self.opts.handshake_timeout,
            activity: activity.clone(),
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

        let idle = activity.idle_for(self.opts.idle_timeout);
        tokio::pin!(idle);
        let handshake = tokio::time::sleep_until(deadline);
        tokio::pin!(handshake);
        let drain = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(drain);
        let stall = self.opts.reply_stall_timeout;
        let mut stall_check = tokio::time::interval((stall / 4).max(Duration::from_millis(100)));
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let (mut handshake_checked, mut closing, mut draining) = (false, false, false);
        loop {
            tokio::select! {
                _ = stall_check.tick() => {
                    if let Some(t) = replies.stalled_for().filter(|t| *t >= stall) {
                        tracing::info!(
                            stalled_ms = t.as_millis() as u64,
                            held = replies.held.load(Ordering::Relaxed),
                            "replies of a connection were not read for server.reply_stall_timeout_ms: connection dropped"
                        );
                        return;
                    }
                }
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
    replies: Arc<ConnReplies>,
    receive_timeout: Duration,
    activity: Arc<Activity>,
}

/// A connection's calls in flight and when the last one ended, for the idle timeout. Calls
/// only count (two atomic operations each, no wake-up); the connection looks at the counts
/// when its idle deadline comes, and sleeps again if a call ran meanwhile.
struct Activity {
    /// Calls in flight.
    calls: AtomicUsize,
    /// When the last call ended, in milliseconds since `start`.
    last_end_ms: AtomicU64,
    start: tokio::time::Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            calls: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            start: tokio::time::Instant::now(),
        }
    }

    /// Returns once the connection has had no call in flight for `timeout`.
    async fn idle_for(self: Arc<Self>, timeout: Duration) {
        let mut deadline = self.start + timeout;
        loop {
            tokio::time::sleep_until(deadline).await;
            if self.calls.load(Ordering::Acquire) > 0 {
                // Busy now: it cannot be idle before a whole timeout from now.
                deadline = tokio::time::Instant::now() + timeout;
                continue;
            }
            let quiet_since =
                self.start + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
            if quiet_since + timeout <= tokio::time::Instant::now() {
                return;
            }
            deadline = quiet_since + timeout;
        }
    }
}

/// Marks one call in flight until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.calls.fetch_add(1, Ordering::AcqRel);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        // Rounded up, so that the connection never counts as quiet early.
        let ended = a.start.elapsed().as_millis() as u64 + 1;
        // Stamped before the count drops, so that a look that sees no call sees this end.
        a.last_end_ms.fetch_max(ended, Ordering::AcqRel);
        a.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

type Response = http::Response<tonic::body::Body>;
type Answer = http::Response<HeldReply>;

impl tower_service::Service<http::Request<Incoming>> for ConnService {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The routes are always ready (an axum router); each call clones them.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Incoming>) -> Self::Future {
        let conn = self.replies.clone();
        let (reply, room, answer) = self.answer(req);
        Box::pin(async move {
            let Ok(response) = answer.await;
            // A reply that can be large is charged before its answer is handed on, so the
            // next call's check on this connection sees it.
            let answer = if reply != Reply::Small || room.is_some() {
                conn.checked(response, reply == Reply::Reads).await
            } else {
                response.map(|inner| HeldReply {
                    first: None,
                    inner,
                    conn,
                })
            };
            // The reply is charged: what its leases took goes back.
            drop(room);
            Ok(answer)
        })
    }
}

type Answering = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl ConnService {
    /// The call's answer, before its body is charged to the connection's replies, what its
    /// reply can be (a call refused on its headers: [`Reply::Small`]) and, for a call that
    /// leases, the room its leases take.
    fn answer(
        &mut self,
        req: http::Request<Incoming>,
    ) -> (Reply, Option<Arc<CallRoom>>, Answering) {
        let guard = InFlight::new(self.activity.clone());
        let mut routes = self.routes.clone();
        let (mut parts, body) = req.into_parts();
        let refused = |status: tonic::Status| -> (Reply, Option<Arc<CallRoom>>, Answering) {
            (
                Reply::Small,
                None,
                Box::pin(std::future::ready(Ok(status.into_http()))),
            )
        };
        let shape = match (self.admit)(&parts) {
            Ok(shape) => shape,
            Err(status) => return refused(status),
        };
        if shape.reply != Reply::Small
            && let Err(status) = self.replies.admit()
        {
            return refused(status);
        }
        let room = shape.leases.then(|| {
            let room = Arc::new(CallRoom {
                conn: self.replies.clone(),
                taken: AtomicU64::new(0),
            });
            parts
                .extensions
                .insert(crate::queue::reserve::RoomHandle(room.clone()));
            room
        });
        // Kept for a panic's log line (a clone of shared bytes, not a copy).
        let uri = parts.uri.clone();
        if shape.streaming {
            // Reflection: small answers, one per request, charged as they are sent and not
            // taken ahead of the headers (its client may send a request only after them).
            return (
                Reply::Small,
                room,
                Box::pin(answer_panics(uri, async move {
                    let _guard = guard;
                    let req = http::Request::from_parts(parts, tonic::body::Body::new(body));
                    tower_service::Service::call(&mut routes, req).await
                })),
            );
        }
        let budget = self.budget.clone();
        let replies = self.replies.clone();
        let timeout = self.receive_timeout;
        let answer = Box::pin(answer_panics(uri, async move {
            let _guard = guard;
            let read = read_message(body, shape.max_message_bytes, &budget);
            let message = match tokio::time::timeout(timeout, read).await {
                Ok(Ok(m)) => match flag_checked(m, &parts.headers) {
                    Ok(m) => m,
                    Err(status) => return Ok(status.into_http()),
                },
                Ok(Err(status)) => return Ok(status.into_http()),
                Err(_) => {
                    return Ok(tonic::Status::deadline_exceeded(format!(
                        "request message not received within server.handshake_timeout_ms ({} ms)",
                        timeout.as_millis()
                    ))
                    .into_http());
                }
            };
            // Checked again now that the call is about to run: its headers may have come long
            // before its message, while the budget was free.
            if shape.reply != Reply::Small
                && let Err(status) = replies.admit()
            {
                return Ok(status.into_http());
            }
            let body = tonic::body::Body::new(http_body_util::Full::new(message));
            tower_service::Service::call(&mut routes, http::Request::from_parts(parts, body)).await
        }));
        (shape.reply, room, answer)
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

/// A unary request body that ended: exactly one message, else `INVALID_ARGUMENT` (a
/// truncated, missing or second message is the caller's fault, where tonic would say
/// `INTERNAL`, or answer the first message and drop the rest).
fn ended(body: Bytes) -> Result<Bytes, tonic::Status> {
    match announced(&[&body]) {
        Some(n) if body.len() < n + 5 => Err(tonic::Status::invalid_argument(format!(
            "request body ends inside its message: {} of the {n} bytes its header announces",
            body.len() - 5
        ))),
        Some(n) if body.len() > n + 5 => Err(tonic::Status::invalid_argument(format!(
            "request body has {} bytes after its message of {n} bytes: a unary call sends \
             exactly one message",
            body.len() - n - 5
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

/// Checks the compressed-flag byte that starts a unary request `message`: 0 (not compressed),
/// or 1 when the call names an encoding in `grpc-encoding` (the gRPC layer then answers
/// `UNIMPLEMENTED` naming it, as this server accepts no compression). Anything else is
/// `INVALID_ARGUMENT` naming the flag, where tonic would say `INTERNAL`.
fn flag_checked(message: Bytes, headers: &http::HeaderMap) -> Result<Bytes, tonic::Status> {
    let encoding = headers
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .filter(|e| *e != "identity");
    match (message.first().copied(), encoding) {
        (Some(0), _) | (Some(1), Some(_)) => Ok(message),
        (Some(1), None) => Err(tonic::Status::invalid_argument(
            "request message has its compressed flag set (1) but the call names no \
             grpc-encoding; send it uncompressed (flag 0)",
        )),
        (Some(flag), _) => Err(tonic::Status::invalid_argument(format!(
            "request message's compressed flag is {flag}: gRPC allows only 0 (uncompressed) \
             or 1 (compressed with the call's grpc-encoding)"
        ))),
        (None, _) => Ok(message),
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
/// - A body that ends before its message is complete, or holds more after it, is
///   `INVALID_ARGUMENT` ([`ended`]). (A second message that starts in a later DATA frame than
///   the end of the first is not read: the call is answered on the first.)
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

    fn conn(budget: &Arc<ReplyBudget>) -> Arc<ConnReplies> {
        Arc::new(ConnReplies::new(budget.clone()))
    }

    #[test]
    fn the_reply_budget_admits_refuses_and_fits_by_connection_and_in_all() {
        let budget = Arc::new(ReplyBudget::new(100, 60));
        let (a, b, c) = (conn(&budget), conn(&budget), conn(&budget));
        // A first reply always fits, whatever its size; then only what stays within both.
        assert!(a.fits(70).is_ok());
        assert!(a.fits(1).is_err(), "past the connection's share");
        assert!(b.fits(30).is_ok());
        assert!(b.fits(1).is_err(), "past the budget in all");
        assert!(
            c.fits(1).is_err(),
            "nothing left in all for another connection"
        );
        assert_eq!((budget.held(), budget.refused()), (100, 0));
        // Admission before a call runs: this connection's share, then the whole budget.
        let own = a.admit().unwrap_err();
        assert_eq!(own.code(), tonic::Code::ResourceExhausted);
        assert!(
            own.message().contains("this connection has 70 bytes")
                && own.message().contains("(60 of 100 bytes)"),
            "{}",
            own.message()
        );
        let all = c.admit().unwrap_err();
        assert!(
            all.message()
                .contains("unread replies hold all of server.reply_buffer_bytes (100 bytes)"),
            "{}",
            all.message()
        );
        assert_eq!(budget.refused(), 2);
        // What is written goes back; a call room gives back what its leases took when dropped.
        a.release(70);
        b.release(30);
        assert!(c.admit().is_ok());
        let room = CallRoom {
            conn: c.clone(),
            taken: AtomicU64::new(0),
        };
        use crate::queue::reserve::ReplyRoom as _;
        assert!(room.try_take(50) && room.try_take(10) && !room.try_take(1));
        assert_eq!(budget.held(), 60);
        drop(room);
        assert_eq!(budget.held(), 0);
    }

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
