//! [`SeppClient`]: one connection to a `sepp.v1` server (ours or the public one), shared by
//! cheap clones.

use crate::admin::JobState;
use crate::coalesce::{Coalescer, DEFAULT_MAX_BATCHES_IN_FLIGHT, EnqueueHandle, job_result};
use crate::error::{
    BatchError, ClientError, EnqueueError, ErrorCode, LeaseError, Rejection, ReserveError,
};
use crate::job::{
    DeadLetterRecord, EnqueueAck, Job, ServerInfo, duration_to_proto, proto_to_system_time,
};
use crate::request::{EnqueueRequest, NackRetry, ReserveOptions};
use crate::retry::{RetryClass, RetryPolicy, is_retryable};
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use std::future::Future;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// The protocol's default key limit. A client does not assume it: until the server has
/// advertised its own `max_idempotency_key_bytes`, key lengths are left to the server.
pub const DEFAULT_MAX_IDEMPOTENCY_KEY_BYTES: u32 = 256;

/// The limits a server advertised (`GetServerInfo`) that a request is checked against before
/// it is sent; 0 for a limit the server did not advertise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdvertisedLimits {
    pub(crate) max_queue_name_bytes: u32,
    pub(crate) max_job_type_bytes: u32,
    pub(crate) max_idempotency_key_bytes: u32,
    pub(crate) strict_queues: bool,
}

/// The default receive limit, in bytes: at least the largest Reserve reply a sepp server
/// sends by default (`limits.max_reserve_reply_bytes`, 4 MiB), with room for servers that
/// raise it. Change it with [`SeppClientBuilder::max_receive_bytes`].
pub const DEFAULT_MAX_RECEIVE_BYTES: usize = 16 * 1024 * 1024;

/// TLS settings for `https://` addresses.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM of the CA that signed the server's certificate. Unset: the public web roots.
    pub ca_pem: Option<Vec<u8>>,
    /// The name to verify the certificate against. Unset: the address's host.
    pub domain: Option<String>,
    /// PEM certificate chain this client presents (mutual TLS, for a server with
    /// `server.tls_client_ca_path`). Set together with `client_key_pem`, or neither.
    pub client_cert_pem: Option<Vec<u8>>,
    /// PEM private key of `client_cert_pem`.
    pub client_key_pem: Option<Vec<u8>>,
}

/// Settings for [`SeppClient`]; start from [`SeppClient::builder`].
#[derive(Debug, Clone)]
pub struct SeppClientBuilder {
    addr: String,
    api_key: Option<String>,
    tls: Option<TlsOptions>,
    rpc_timeout: Option<Duration>,
    connect_timeout: Duration,
    max_receive_bytes: usize,
    retry: Option<RetryPolicy>,
    coalesce: bool,
    max_batches_in_flight: usize,
}

impl SeppClientBuilder {
    /// Sends `authorization: Bearer <key>` on every call.
    #[must_use]
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// TLS options (also switched on by an `https://` address).
    #[must_use]
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Deadline of each call (Reserve adds its wait). Default 30 s; `None` for no deadline.
    #[must_use]
    pub fn rpc_timeout(mut self, d: Option<Duration>) -> Self {
        self.rpc_timeout = d;
        self
    }

    /// How long establishing the connection may take. Default 10 s.
    #[must_use]
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Largest response accepted, in bytes. Default 16 MiB (the server's default
    /// `max_message_bytes`).
    #[must_use]
    pub fn max_receive_bytes(mut self, n: usize) -> Self {
        self.max_receive_bytes = n;
        self
    }

    /// Retries per the protocol's safe-retry table (see [`crate::retry`]). On by default with
    /// [`RetryPolicy::default`] (2 retries, pauses from 50 ms).
    #[must_use]
    pub fn retry_policy(mut self, p: RetryPolicy) -> Self {
        self.retry = Some(p);
        self
    }

    /// Makes every call once: no automatic retries, so the caller sees the first failure.
    #[must_use]
    pub fn no_retries(mut self) -> Self {
        self.retry = None;
        self
    }

    /// Whether concurrent `enqueue` calls leave together as one `EnqueueBatch` (see
    /// [`crate::coalesce`]). Default `true`. With `false`, each `enqueue` is its own RPC.
    ///
    /// Coalescing adds no wait: an enqueue on an idle client leaves at once. Each caller
    /// gets its own ack, rejection or error. A caller that drops its future before its batch
    /// left is not sent; after that, the job may be committed (as with a unary call whose
    /// reply was lost).
    #[must_use]
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Most coalesced batches in flight at once, 1 or more; enqueues made while all are in
    /// flight wait and leave together in the next. Default
    /// [`DEFAULT_MAX_BATCHES_IN_FLIGHT`].
    /// Unused with `coalesce(false)`. Connecting with 0 fails with
    /// [`ErrorCode::InvalidConfig`].
    #[must_use]
    pub fn max_batches_in_flight(mut self, n: usize) -> Self {
        self.max_batches_in_flight = n;
        self
    }

    fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let (url, tls_by_scheme) = normalize_addr(&self.addr)?;
        let mut ep = Endpoint::from_shared(url.clone()).map_err(|e| {
            ClientError::new(
                ErrorCode::InvalidConfig,
                format!("address {:?}: {e}", self.addr),
            )
        })?;
        // No adaptive HTTP/2 window: with it, h2 gives small responses a tiny budget and the
        // client closes its own connection (GOAWAY "too_many_data_frames") once a few hundred
        // calls are in flight at once. Fixed, generous windows instead.
        ep = ep
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .initial_connection_window_size(16 * 1024 * 1024)
            .initial_stream_window_size(2 * 1024 * 1024);
        if tls_by_scheme || self.tls.is_some() {
            let opts = self.tls.clone().unwrap_or_default();
            let mut cfg = ClientTlsConfig::new();
            cfg = match opts.ca_pem {
                Some(pem) => cfg.ca_certificate(Certificate::from_pem(pem)),
                None => cfg.with_webpki_roots(),
            };
            if let Some(d) = opts.domain {
                cfg = cfg.domain_name(d);
            }
            match (opts.client_cert_pem, opts.client_key_pem) {
                (Some(cert), Some(key)) => {
                    cfg = cfg.identity(tonic::transport::Identity::from_pem(cert, key));
                }
                (None, None) => {}
                (cert, _) => {
                    let (set, missing) = if cert.is_some() {
                        ("client_cert_pem", "client_key_pem")
                    } else {
                        ("client_key_pem", "client_cert_pem")
                    };
                    return Err(ClientError::new(
                        ErrorCode::InvalidConfig,
                        format!(
                            "tls settings: {set} is set but {missing} is not: set both or neither"
                        ),
                    ));
                }
            }
            ep = ep.tls_config(cfg).map_err(|e| {
                ClientError::new(ErrorCode::InvalidConfig, format!("tls settings: {e}"))
            })?;
        }
        Ok(ep)
    }

    /// The `authorization` header value for the API key, if one is set.
    fn api_key_header(&self) -> Result<Option<MetadataValue<Ascii>>, ClientError> {
        let Some(k) = &self.api_key else {
            return Ok(None);
        };
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_graphic()) {
            return Err(ClientError::new(
                ErrorCode::InvalidConfig,
                "api key must be non-empty printable ASCII without spaces",
            ));
        }
        format!("Bearer {k}")
            .parse::<MetadataValue<Ascii>>()
            .map(Some)
            .map_err(|_| {
                ClientError::new(
                    ErrorCode::InvalidConfig,
                    "api key is not a valid header value",
                )
            })
    }

    /// The settings that no connection can fix.
    fn check(&self) -> Result<(), ClientError> {
        if self.max_batches_in_flight == 0 {
            return Err(ClientError::new(
                ErrorCode::InvalidConfig,
                "max_batches_in_flight is 0: it must be at least 1",
            ));
        }
        self.api_key_header().map(drop)
    }

    fn finish(self, channel: Channel) -> Result<SeppClient, ClientError> {
        self.check()?;
        let api_key = self.api_key_header()?;
        let admin = AdminServiceClient::new(channel.clone())
            .max_decoding_message_size(self.max_receive_bytes)
            .max_encoding_message_size(usize::MAX);
        let grpc = QueueServiceClient::new(channel.clone())
            .max_decoding_message_size(self.max_receive_bytes)
            .max_encoding_message_size(usize::MAX);
        Ok(SeppClient {
            inner: Arc::new(Inner {
                grpc,
                admin,
                channel,
                api_key,
                rpc_timeout: self.rpc_timeout,
                retry: self.retry,
                limits: RwLock::new(None),
                max_enqueue_batch: AtomicU32::new(0),
                max_reason_bytes: AtomicU32::new(0),
                coalescer: self
                    .coalesce
                    .then(|| Coalescer::new(self.max_batches_in_flight)),
            }),
        })
    }

    /// Connects, then reads the server's limits (`GetServerInfo`), so that requests are
    /// checked against the real `max_idempotency_key_bytes` before they are sent.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidConfig`] for an unusable address or TLS settings;
    /// [`ErrorCode::Transport`] when the server cannot be reached.
    pub async fn connect(self) -> Result<SeppClient, ClientError> {
        // Settings errors first, so that they are not hidden by a transport error.
        self.check()?;
        let ep = self.endpoint()?;
        let channel = ep.connect().await.map_err(|e| {
            let chain = error_chain(&e);
            // rustls's words for a reply that is not TLS: an https:// address of a server that
            // serves plain text.
            let hint = if chain.contains("InvalidContentType") {
                " (the server answered without TLS: for a plain-text server, use http://)"
            } else {
                ""
            };
            ClientError::new(
                ErrorCode::Transport,
                format!("cannot connect to {}: {chain}{hint}", self.addr),
            )
        })?;
        let client = self.finish(channel)?;
        // Servers without GetServerInfo keep the defaults; any other failure is reported.
        match client.get_server_info().await {
            Ok(_) => {}
            Err(e) if e.code() == ErrorCode::Unsupported => {}
            Err(e) => return Err(e),
        }
        Ok(client)
    }

    /// A client that connects on first use; nothing is sent until a call is made. The
    /// structural checks of requests work even when no server is running; the lengths that
    /// depend on the server's limits are left to the server until [`SeppClient::get_server_info`]
    /// has been called, so a key the server accepts is never refused here.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidConfig`] for an unusable address or TLS settings.
    pub fn connect_lazy(self) -> Result<SeppClient, ClientError> {
        let ep = self.endpoint()?;
        let channel = ep.connect_lazy();
        self.finish(channel)
    }
}

/// `host:port` → `http://host:port`; returns the URL and whether its scheme asks for TLS.
/// Every address a client takes goes through it (the server's CLI too).
///
/// # Errors
/// [`ErrorCode::InvalidConfig`] for an empty address or another scheme.
pub fn normalize_addr(addr: &str) -> Result<(String, bool), ClientError> {
    if addr.is_empty() {
        return Err(ClientError::new(
            ErrorCode::InvalidConfig,
            "address is empty",
        ));
    }
    if let Some(rest) = addr.strip_prefix("https://") {
        return Ok((format!("https://{rest}"), true));
    }
    if addr.starts_with("http://") {
        return Ok((addr.to_string(), false));
    }
    if addr.contains("://") {
        return Err(ClientError::new(
            ErrorCode::InvalidConfig,
            format!("address {addr:?}: use http://host:port, https://host:port or host:port"),
        ));
    }
    Ok((format!("http://{addr}"), false))
}

/// The error and its sources, joined by ": ". A source whose text the message already ends
/// with (wrappers that repeat their cause, as hyper's "tcp connect error" does) is skipped.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let text = inner.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod error_chain_tests {
    use super::error_chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_source_that_repeats_the_message_so_far_is_not_repeated() {
        let e = E(
            "transport error",
            Some(Box::new(E(
                "tcp connect error",
                Some(Box::new(E(
                    "tcp connect error",
                    Some(Box::new(E("Connection refused", None))),
                ))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "transport error: tcp connect error: Connection refused"
        );
    }
}

pub(crate) struct Inner {
    pub(crate) grpc: QueueServiceClient<Channel>,
    pub(crate) admin: AdminServiceClient<Channel>,
    channel: Channel,
    api_key: Option<MetadataValue<Ascii>>,
    rpc_timeout: Option<Duration>,
    retry: Option<RetryPolicy>,
    /// The server's limits, once it advertised them (`None` before: lengths are left to it).
    limits: RwLock<Option<AdvertisedLimits>>,
    /// The server's `max_enqueue_batch` (0 until known: not checked).
    max_enqueue_batch: AtomicU32,
    /// The server's `max_reason_bytes` (0 until known, or from a server that does not
    /// advertise it: not truncated).
    max_reason_bytes: AtomicU32,
    /// Where concurrent enqueues wait for a batch; `None` with `coalesce(false)`.
    pub(crate) coalescer: Option<Coalescer>,
}

/// A client of a `sepp.v1` server.
///
/// Cheap to clone: clones share one HTTP/2 connection. Every method takes `&self` and may be
/// called from many tasks at once.
#[derive(Clone)]
pub struct SeppClient {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for SeppClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeppClient")
            .field(
                "max_idempotency_key_bytes",
                &self.max_idempotency_key_bytes(),
            )
            .finish_non_exhaustive()
    }
}

impl SeppClient {
    /// Connects to `addr` (`http://host:port`, `https://host:port` or `host:port`) with the
    /// default settings.
    ///
    /// # Errors
    /// As [`SeppClientBuilder::connect`].
    pub async fn connect(addr: impl Into<String>) -> Result<Self, ClientError> {
        Self::builder(addr).connect().await
    }

    /// Settings for a client of `addr`.
    pub fn builder(addr: impl Into<String>) -> SeppClientBuilder {
        SeppClientBuilder {
            addr: addr.into(),
            api_key: None,
            tls: None,
            rpc_timeout: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(10),
            max_receive_bytes: DEFAULT_MAX_RECEIVE_BYTES,
            retry: Some(RetryPolicy::default()),
            coalesce: true,
            max_batches_in_flight: DEFAULT_MAX_BATCHES_IN_FLIGHT,
        }
    }

    /// A client over an existing tonic channel, with default settings.
    pub fn from_channel(channel: Channel) -> Self {
        match Self::builder("http://unused").finish(channel) {
            Ok(c) => c,
            Err(_) => unreachable!("no api key is set, so finishing cannot fail"),
        }
    }

    /// The underlying channel (for other services on the same connection).
    pub fn channel(&self) -> Channel {
        self.inner.channel.clone()
    }

    /// The idempotency key limit requests are checked against before sending, in UTF-8 bytes:
    /// the server's, once it advertised it (`SeppClient::connect` asks); `None` before, when
    /// key lengths are left to the server.
    pub fn max_idempotency_key_bytes(&self) -> Option<u32> {
        self.limits()
            .map(|l| l.max_idempotency_key_bytes)
            .filter(|n| *n > 0)
    }

    /// Most jobs the server takes in one `enqueue_batch`, as it advertised it (`SeppClient::connect`
    /// asks); `None` before it is known, when batch sizes are left to the server.
    pub fn max_enqueue_batch(&self) -> Option<u32> {
        Some(self.inner.max_enqueue_batch.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    fn limits(&self) -> Option<AdvertisedLimits> {
        *self.inner.limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The nack reason length the server keeps, in UTF-8 bytes, as it advertised it (0 until
    /// known, or when it does not): longer reasons are cut to it before they are sent.
    pub fn max_reason_bytes(&self) -> u32 {
        self.inner.max_reason_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn request<T>(&self, msg: T, extra: Option<Duration>) -> tonic::Request<T> {
        let timeout = self
            .inner
            .rpc_timeout
            .map(|t| t + extra.unwrap_or_default());
        self.request_with_timeout(msg, timeout)
    }

    /// A request with the client's metadata and the deadline `timeout` (none for `None`).
    pub(crate) fn request_with_timeout<T>(
        &self,
        msg: T,
        timeout: Option<Duration>,
    ) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(k) = &self.inner.api_key {
            req.metadata_mut().insert("authorization", k.clone());
        }
        if let Some(t) = timeout {
            req.set_timeout(t);
            // A coalesced batch's timeout is what is left of its earliest caller's, so its
            // `grpc-timeout` differs on nearly every call. HPACK would add each value to the
            // connection's header table, and then compare every later value with all of them
            // (the table chains entries by name): 7 % of the client's CPU under 32 busy
            // connections. Sent as never-indexed, it costs a few bytes per call instead.
            if let Some(v) = req.metadata_mut().get_mut("grpc-timeout") {
                v.set_sensitive(true);
            }
        }
        req
    }

    /// The deadline of each call, `None` for none.
    pub(crate) fn rpc_timeout(&self) -> Option<Duration> {
        self.inner.rpc_timeout
    }

    /// Runs `call` on the queue service with the retry policy for `class`.
    async fn call<T, F, Fut>(&self, class: RetryClass, mut call: F) -> Result<T, tonic::Status>
    where
        F: FnMut(QueueServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.with_retries(class, || call(self.inner.grpc.clone()))
            .await
    }

    /// Runs `attempt` until it succeeds, the error is not retryable under `class`, or the
    /// retry policy (if any) gives up.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        class: RetryClass,
        mut attempt: F,
    ) -> Result<T, tonic::Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut tries = 0u32;
        loop {
            tries += 1;
            match attempt().await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => {
                    let Some(p) = &self.inner.retry else {
                        return Err(s);
                    };
                    if tries > p.max_retries || !is_retryable(class, &s) {
                        return Err(s);
                    }
                    tracing::debug!(code = ?s.code(), tries, "retrying sepp call");
                    tokio::time::sleep(p.retry_delay(tries)).await;
                }
            }
        }
    }

    /// Enqueues one job.
    ///
    /// The request is checked first, without a network call: structure
    /// ([`EnqueueRequest::validate`]) and, once the server advertised its limits, the lengths
    /// up to the idempotency key's (see [`SeppClient::max_idempotency_key_bytes`]). A job that
    /// fails the checks is rejected here and never joins a batch.
    ///
    /// On the wire it is an `EnqueueBatch`: of this job alone when the client is idle or built
    /// with [`SeppClientBuilder::coalesce`]`(false)`, else together with the other enqueues
    /// made on this client while its batches in flight were busy (see [`crate::coalesce`]).
    /// Either way the result is this job's own. Dropping the future before its batch left
    /// sends nothing; after that, the job may be committed.
    ///
    /// # Errors
    /// [`EnqueueError::Rejected`] with the client's or the server's [`Rejection`] (e.g.
    /// [`Rejection::IdempotencyKeyTooLong`] `{ limit, actual }`); [`EnqueueError::Client`] for
    /// transport, auth and server failures.
    ///
    /// # Example
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use sepp_rs::{client::SeppClient, EnqueueRequest};
    /// let client = SeppClient::connect("http://127.0.0.1:50051").await?;
    /// let ack = client
    ///     .enqueue(EnqueueRequest::new("invoices", "render")?.with_idempotency_key("invoice-17"))
    ///     .await?;
    /// println!("{} (deduplicated: {})", ack.job_id, ack.deduplicated);
    /// # Ok(()) }
    /// ```
    pub async fn enqueue(&self, request: EnqueueRequest) -> Result<EnqueueAck, EnqueueError> {
        request.check_before_sending(self.limits().as_ref())?;
        self.enqueue_checked(request).await
    }

    /// [`SeppClient::enqueue`] of a request that passed the checks before sending.
    async fn enqueue_checked(&self, request: EnqueueRequest) -> Result<EnqueueAck, EnqueueError> {
        if let Some(c) = &self.inner.coalescer {
            return c.enqueue(self, request.to_proto()).await;
        }
        let class = if request.is_keyed() {
            RetryClass::KeyedEnqueue
        } else {
            RetryClass::UnkeyedEnqueue
        };
        let batch = pb::EnqueueBatchRequest {
            jobs: vec![request.to_proto()],
        };
        let resp = self
            .call(class, |mut c| {
                let req = self.request(batch.clone(), None);
                async move { c.enqueue_batch(req).await }
            })
            .await
            .map_err(|s| ClientError::from_status(&s, false))?;
        match resp.results.into_iter().next() {
            Some(r) => job_result(r),
            None => Err(EnqueueError::Client(ClientError::new(
                ErrorCode::ServerFault,
                "the server returned no result for the job",
            ))),
        }
    }

    /// [`SeppClient::enqueue`] for callers that are not tokio tasks (a binding's event-loop
    /// thread): instead of a future, `on_reply` gets the answer, called once, from whichever
    /// thread answers it (a task on `runtime`, the client's own; a thread that formed a batch,
    /// for a job whose `rpc_timeout` passed while it waited; the calling thread, at once, for a
    /// job refused by the checks before sending). It must not block. With coalescing on, the
    /// job joins the client's queue directly: a call that waits for a batch costs no task and
    /// no wake-up of its own, the batch that takes it answers it (a call on an idle client
    /// leaves in a batch task of its own). Without coalescing, each call runs in a task.
    ///
    /// The returned handle cancels the call: a job whose batch has not left yet is never sent
    /// and its `on_reply` is not called; after that, the job may exist and `on_reply` may still
    /// be called, as with a unary call cut off.
    pub fn enqueue_with<F>(
        &self,
        runtime: &tokio::runtime::Handle,
        request: EnqueueRequest,
        on_reply: F,
    ) -> EnqueueHandle
    where
        F: FnOnce(Result<EnqueueAck, EnqueueError>) + Send + 'static,
    {
        if let Err(r) = request.check_before_sending(self.limits().as_ref()) {
            on_reply(Err(EnqueueError::Rejected(r)));
            return EnqueueHandle::default();
        }
        let _entered = runtime.enter();
        match &self.inner.coalescer {
            Some(c) => c.enqueue_with(self, request.to_proto(), Box::new(on_reply)),
            None => {
                let client = self.clone();
                let call = async move { client.enqueue_checked(request).await };
                EnqueueHandle::spawn(runtime, call, Box::new(on_reply))
            }
        }
    }

    fn check_batch_len(&self, n: usize) -> Result<(), BatchError> {
        if n == 0 {
            return Err(BatchError::Invalid(
                "jobs is empty: send at least one job".into(),
            ));
        }
        let max = self.inner.max_enqueue_batch.load(Ordering::Relaxed);
        if max > 0 && n > max as usize {
            return Err(BatchError::Invalid(format!(
                "jobs has {n} entries, max_enqueue_batch is {max}"
            )));
        }
        Ok(())
    }

    /// Enqueues each job on its own: one result per request, in order. Jobs that fail the
    /// client-side checks are not sent and get their [`Rejection`] as their result.
    ///
    /// # Errors
    /// [`BatchError::Invalid`] for an empty batch or one over `max_enqueue_batch`;
    /// [`BatchError::Client`] when the call fails as a whole.
    pub async fn enqueue_batch(
        &self,
        requests: Vec<EnqueueRequest>,
    ) -> Result<Vec<Result<EnqueueAck, Rejection>>, BatchError> {
        self.enqueue_batch_prepared(requests.into_iter().map(Ok).collect())
            .await
    }

    /// [`SeppClient::enqueue_batch`] for requests a binding built from another language's
    /// values: a slot whose value could not become a request (a negative priority, a naive
    /// datetime, ...) carries its rejection, which is its result, as if the checks before
    /// sending had refused it. So a bad job is a rejection in its own slot in every language.
    ///
    /// # Errors
    /// As [`SeppClient::enqueue_batch`].
    pub async fn enqueue_batch_prepared(
        &self,
        requests: Vec<Result<EnqueueRequest, Rejection>>,
    ) -> Result<Vec<Result<EnqueueAck, Rejection>>, BatchError> {
        self.check_batch_len(requests.len())?;
        let limits = self.limits();
        let mut results: Vec<Option<Result<EnqueueAck, Rejection>>> =
            Vec::with_capacity(requests.len());
        let mut jobs = Vec::with_capacity(requests.len());
        let mut slots = Vec::with_capacity(requests.len());
        let mut keyed = true;
        for (i, r) in requests.iter().enumerate() {
            let checked = r
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|r| r.check_before_sending(limits.as_ref()).map(|()| r));
            match checked {
                Ok(r) => {
                    keyed &= r.is_keyed();
                    jobs.push(r.to_proto());
                    slots.push(i);
                    results.push(None);
                }
                Err(rej) => results.push(Some(Err(rej))),
            }
        }
        if !jobs.is_empty() {
            let class = if keyed {
                RetryClass::KeyedEnqueue
            } else {
                RetryClass::UnkeyedEnqueue
            };
            let batch = pb::EnqueueBatchRequest { jobs };
            let resp = self
                .call(class, |mut c| {
                    let req = self.request(batch.clone(), None);
                    async move { c.enqueue_batch(req).await }
                })
                .await
                .map_err(|s| ClientError::from_status(&s, false))?;
            if resp.results.len() != slots.len() {
                return Err(BatchError::Client(ClientError::new(
                    ErrorCode::ServerFault,
                    format!(
                        "the server returned {} results for {} jobs",
                        resp.results.len(),
                        slots.len()
                    ),
                )));
            }
            for (slot, r) in slots.into_iter().zip(resp.results) {
                results[slot] = Some(match r.outcome {
                    Some(pb::job_result::Outcome::Success(s)) => Ok(EnqueueAck {
                        original_state: s.original_state.map(JobState::from_proto),
                        job_id: s.job_id,
                        deduplicated: s.deduplicated,
                        replaced: s.replaced,
                    }),
                    Some(pb::job_result::Outcome::Rejection(r)) => Err(rejection_from_proto(r)),
                    None => Err(Rejection::Unknown),
                });
            }
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// Enqueues all jobs or none. Returns the acks in order, or every failing index with its
    /// rejection (nothing was written). Jobs failing the client-side checks fail the batch
    /// without any network call.
    ///
    /// # Errors
    /// As [`SeppClient::enqueue_batch`].
    pub async fn enqueue_atomic(
        &self,
        requests: Vec<EnqueueRequest>,
    ) -> Result<Result<Vec<EnqueueAck>, Vec<(u32, Rejection)>>, BatchError> {
        self.enqueue_atomic_prepared(requests.into_iter().map(Ok).collect())
            .await
    }

    /// [`SeppClient::enqueue_atomic`] for requests a binding built from another language's
    /// values, as [`SeppClient::enqueue_batch_prepared`]: a slot carrying a rejection fails
    /// the batch, listed with the others, without any network call.
    ///
    /// # Errors
    /// As [`SeppClient::enqueue_batch`].
    pub async fn enqueue_atomic_prepared(
        &self,
        requests: Vec<Result<EnqueueRequest, Rejection>>,
    ) -> Result<Result<Vec<EnqueueAck>, Vec<(u32, Rejection)>>, BatchError> {
        self.check_batch_len(requests.len())?;
        let limits = self.limits();
        let failures: Vec<(u32, Rejection)> = requests
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let checked = match r {
                    Ok(r) => r.check_before_sending(limits.as_ref()),
                    Err(rejection) => Err(rejection.clone()),
                };
                checked.err().map(|e| (i as u32, e))
            })
            .collect();
        if !failures.is_empty() {
            return Ok(Err(failures));
        }
        let requests: Vec<EnqueueRequest> = requests.into_iter().flatten().collect();
        let class = if requests.iter().all(EnqueueRequest::is_keyed) {
            RetryClass::KeyedEnqueue
        } else {
            RetryClass::UnkeyedEnqueue
        };
        let batch = pb::EnqueueBatchRequest {
            jobs: requests.iter().map(EnqueueRequest::to_proto).collect(),
        };
        let resp = self
            .call(class, |mut c| {
                let req = self.request(batch.clone(), None);
                async move { c.enqueue_atomic(req).await }
            })
            .await
            .map_err(|s| ClientError::from_status(&s, false))?;
        match resp.outcome {
            Some(pb::enqueue_atomic_response::Outcome::Success(s)) => Ok(Ok(s
                .responses
                .into_iter()
                .map(|r| EnqueueAck {
                    original_state: r.original_state.map(JobState::from_proto),
                    job_id: r.job_id,
                    deduplicated: r.deduplicated,
                    replaced: r.replaced,
                })
                .collect())),
            Some(pb::enqueue_atomic_response::Outcome::Rejection(f)) => Ok(Err(f
                .errors
                .into_iter()
                .map(|e| {
                    (
                        e.index,
                        e.rejection.map_or(Rejection::Unknown, rejection_from_proto),
                    )
                })
                .collect())),
            None => Err(BatchError::Client(ClientError::new(
                ErrorCode::ServerFault,
                "the server returned no outcome",
            ))),
        }
    }

    /// Leases up to `max_jobs` ready jobs, waiting up to `wait_timeout` for the first. Never
    /// retried automatically: a lost reply would lease jobs twice.
    ///
    /// # Errors
    /// [`ReserveError::Invalid`] before sending (no queues, zero lease, `max_jobs = 0`);
    /// [`ReserveError::Client`] otherwise ([`ErrorCode::FailedPrecondition`] for a strict-mode
    /// unknown queue).
    pub async fn reserve(&self, options: ReserveOptions) -> Result<Vec<Job>, ReserveError> {
        options.validate().map_err(ReserveError::Invalid)?;
        let wait = options.wait_timeout;
        let msg = pb::ReserveRequest {
            queues: options.queues,
            wait_timeout: wait.map(duration_to_proto),
            lease_duration: Some(duration_to_proto(options.lease_duration)),
            worker_id: options.worker_id,
            max_jobs: options.max_jobs,
        };
        let slack = wait.map(|w| w + Duration::from_secs(5));
        let resp = self
            .call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), slack);
                async move { c.reserve(req).await }
            })
            .await
            .map_err(|s| ClientError::from_status(&s, false))?;
        Ok(resp.jobs.into_iter().map(Job::from_proto).collect())
    }

    /// Acks delivery `attempt` of `job_id`: the job is done.
    ///
    /// # Errors
    /// [`LeaseError::NotInFlight`] / [`LeaseError::AttemptMismatch`] when the lease is lost;
    /// [`LeaseError::Client`] otherwise.
    pub async fn ack(&self, job_id: &str, attempt: u32) -> Result<(), LeaseError> {
        let msg = pb::AckRequest {
            job_id: job_id.to_string(),
            attempt,
            worker_id: None,
            then_reserve: None,
        };
        self.call(RetryClass::Settle, |mut c| {
            let req = self.request(msg.clone(), None);
            async move { c.ack(req).await }
        })
        .await
        .map_err(|s| LeaseError::from_client(job_id, ClientError::from_status(&s, true)))?;
        Ok(())
    }

    /// Acks delivery `attempt` of `job_id` and, in the same call, leases jobs per `next` (as
    /// [`SeppClient::reserve`] would, without waiting): a worker's ack that brings its next
    /// job. A sepp server commits the ack and the new leases together, one round trip and one
    /// commit instead of two of each.
    ///
    /// `Ok(Some(jobs))`: acked, and `jobs` leased (empty when none was ready: long-poll with
    /// [`SeppClient::reserve`]). `Ok(None)`: acked, but the server leased nothing for the
    /// request (a server without this extension, such as the public sepp 0.1.1, or a lease that
    /// failed after the ack took): reserve with [`SeppClient::reserve`].
    ///
    /// Retried as [`SeppClient::ack`] is. That leases no job twice: a retry after the first try
    /// took is refused ([`LeaseError::NotInFlight`], as a retried ack is) and a refused ack
    /// leases nothing, so a lost reply strands only the jobs it leased, until their leases
    /// expire and they are delivered again.
    ///
    /// # Errors
    /// [`LeaseError::Invalid`] before sending for `next` as [`SeppClient::reserve`] checks it,
    /// or a `next.wait_timeout` above zero; otherwise as [`SeppClient::ack`] (nothing was
    /// leased when the ack failed).
    pub async fn ack_then_reserve(
        &self,
        job_id: &str,
        attempt: u32,
        next: ReserveOptions,
    ) -> Result<Option<Vec<Job>>, LeaseError> {
        next.validate().map_err(LeaseError::Invalid)?;
        if next.wait_timeout.is_some_and(|w| !w.is_zero()) {
            return Err(LeaseError::Invalid(
                "wait_timeout of the reserve after an ack must be unset: it does not wait".into(),
            ));
        }
        let msg = pb::AckRequest {
            job_id: job_id.to_string(),
            attempt,
            worker_id: None,
            then_reserve: Some(pb::ReserveRequest {
                queues: next.queues,
                wait_timeout: None,
                lease_duration: Some(duration_to_proto(next.lease_duration)),
                worker_id: next.worker_id,
                max_jobs: next.max_jobs,
            }),
        };
        let resp = self
            .call(RetryClass::Settle, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.ack(req).await }
            })
            .await
            .map_err(|s| LeaseError::from_client(job_id, ClientError::from_status(&s, true)))?;
        Ok(resp
            .next
            .map(|n| n.jobs.into_iter().map(Job::from_proto).collect()))
    }

    /// Nacks delivery `attempt` of `job_id`. Returns whether the job was dead-lettered (the
    /// dead-letter strategy, or a retry on its last attempt).
    ///
    /// # Errors
    /// As [`SeppClient::ack`].
    pub async fn nack(
        &self,
        job_id: &str,
        attempt: u32,
        retry: NackRetry,
        reason: Option<String>,
    ) -> Result<bool, LeaseError> {
        use pb::nack_retry::Strategy;
        let strategy = match retry {
            NackRetry::Default => Strategy::Default(()),
            NackRetry::Delay(d) => Strategy::Delay(duration_to_proto(d)),
            NackRetry::DeadLetter => Strategy::DeadLetter(()),
        };
        // The server keeps at most max_reason_bytes of a reason; cut it here to the same
        // length (at a character boundary) rather than send what would not be kept.
        let max = self.inner.max_reason_bytes.load(Ordering::Relaxed);
        let reason = match reason {
            Some(r) if max > 0 => Some(sepp_rules::truncate_utf8(r, max as usize)),
            r => r,
        };
        let msg = pb::NackRequest {
            job_id: job_id.to_string(),
            attempt,
            reason,
            retry: Some(pb::NackRetry {
                strategy: Some(strategy),
            }),
            worker_id: None,
        };
        let resp = self
            .call(RetryClass::Settle, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.nack(req).await }
            })
            .await
            .map_err(|s| LeaseError::from_client(job_id, ClientError::from_status(&s, true)))?;
        Ok(resp.dead_lettered)
    }

    /// Sets the lease of delivery `attempt` of `job_id` to now + `lease_duration` (clamped by
    /// the server). Returns the new expiry.
    ///
    /// # Errors
    /// [`LeaseError::Invalid`] for a duration under 1 ms; otherwise as [`SeppClient::ack`].
    pub async fn extend(
        &self,
        job_id: &str,
        attempt: u32,
        lease_duration: Duration,
    ) -> Result<SystemTime, LeaseError> {
        crate::request::check_lease(lease_duration).map_err(LeaseError::Invalid)?;
        let msg = pb::ExtendRequest {
            job_id: job_id.to_string(),
            attempt,
            lease_duration: Some(duration_to_proto(lease_duration)),
            worker_id: None,
        };
        let resp = self
            .call(RetryClass::Settle, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.extend(req).await }
            })
            .await
            .map_err(|s| LeaseError::from_client(job_id, ClientError::from_status(&s, true)))?;
        resp.lease_expires_at
            .as_ref()
            .map(proto_to_system_time)
            .ok_or_else(|| {
                LeaseError::Client(ClientError::new(
                    ErrorCode::ServerFault,
                    "the server returned no lease expiry",
                ))
            })
    }

    /// Removes and returns up to `max` dead-letter records (at least 1), oldest first, of one
    /// queue or of all. Destructive and never retried automatically.
    ///
    /// # Errors
    /// [`ReserveError::Invalid`] for `max = 0`; [`ReserveError::Client`] otherwise.
    pub async fn drain_dead_letters(
        &self,
        queue: Option<&str>,
        max: u32,
    ) -> Result<Vec<DeadLetterRecord>, ReserveError> {
        if max == 0 {
            return Err(ReserveError::Invalid(
                "max is 0: ask for at least 1 record".into(),
            ));
        }
        let msg = pb::DrainDeadLettersRequest {
            queue: queue.map(str::to_string),
            max: Some(max),
        };
        let resp = self
            .call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.drain_dead_letters(req).await }
            })
            .await
            .map_err(|s| ClientError::from_status(&s, false))?;
        Ok(resp
            .records
            .into_iter()
            .map(DeadLetterRecord::from_proto)
            .collect())
    }

    /// The server's version and limits. Also refreshes the limits this client checks
    /// requests against.
    ///
    /// # Errors
    /// [`ClientError`] for transport, auth and server failures.
    pub async fn get_server_info(&self) -> Result<ServerInfo, ClientError> {
        let resp = self
            .call(RetryClass::Read, |mut c| {
                let req = self.request(pb::GetServerInfoRequest {}, None);
                async move { c.get_server_info(req).await }
            })
            .await
            .map_err(|s| ClientError::from_status(&s, false))?;
        let info = ServerInfo::from_proto(resp);
        *self.inner.limits.write().unwrap_or_else(|e| e.into_inner()) = Some(AdvertisedLimits {
            max_queue_name_bytes: info.max_queue_name_bytes,
            max_job_type_bytes: info.max_job_type_bytes,
            max_idempotency_key_bytes: info.max_idempotency_key_bytes,
            strict_queues: info.strict_queues,
        });
        self.inner
            .max_enqueue_batch
            .store(info.max_enqueue_batch, Ordering::Relaxed);
        self.inner
            .max_reason_bytes
            .store(info.max_reason_bytes, Ordering::Relaxed);
        Ok(info)
    }
}

/// Decodes a wire rejection into the client's [`Rejection`].
pub(crate) fn rejection_from_proto(r: pb::JobRejection) -> Rejection {
    use pb::job_rejection::Reason as R;
    match r.reason {
        Some(R::UnknownQueue(x)) => Rejection::UnknownQueue { queue: x.queue },
        Some(R::PayloadTooLarge(x)) => Rejection::PayloadTooLarge {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::EncodingNotAllowed(x)) => Rejection::EncodingNotAllowed {
            encoding: x.encoding,
            allowed: x.allowed,
        },
        Some(R::JobTypeNotAllowed(x)) => Rejection::JobTypeNotAllowed {
            job_type: x.job_type,
            allowed: x.allowed,
        },
        Some(R::CustomEntriesTooMany(x)) => Rejection::CustomEntriesTooMany {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::CustomMapTooLarge(x)) => Rejection::CustomMapTooLarge {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::CustomKeyTooLong(x)) => Rejection::CustomKeyTooLong {
            key: x.key,
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::QueueNameTooLong(x)) => Rejection::QueueNameTooLong {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::JobTypeNameTooLong(x)) => Rejection::JobTypeNameTooLong {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::IdempotencyKeyTooLong(x)) => Rejection::IdempotencyKeyTooLong {
            limit: x.limit,
            actual: x.actual,
        },
        Some(R::ScheduledTooFar(x)) => Rejection::ScheduledTooFar {
            horizon: x
                .horizon
                .as_ref()
                .and_then(crate::job::proto_to_duration)
                .unwrap_or_default(),
            actual: x
                .actual
                .as_ref()
                .map_or(SystemTime::UNIX_EPOCH, proto_to_system_time),
        },
        Some(R::InvalidRequest(x)) => Rejection::InvalidRequest { message: x.message },
        Some(R::QueueFull(x)) => Rejection::QueueFull {
            queue: x.queue,
            limit: x.limit,
        },
        Some(R::QueueClosing(x)) => Rejection::QueueClosing { queue: x.queue },
        Some(R::TooManyQueues(x)) => Rejection::TooManyQueues {
            queue: x.queue,
            limit: x.limit,
        },
        Some(R::IdempotencyKeyConflict(x)) => Rejection::IdempotencyKeyConflict {
            original_job_id: x.original_job_id,
        },
        None => Rejection::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalized() {
        assert_eq!(
            normalize_addr("localhost:1").unwrap(),
            ("http://localhost:1".into(), false)
        );
        assert_eq!(
            normalize_addr("https://h:1").unwrap(),
            ("https://h:1".into(), true)
        );
        assert!(normalize_addr("ftp://h:1").is_err());
        assert!(normalize_addr("").is_err());
    }

    #[tokio::test]
    async fn a_deadline_is_sent_never_indexed() {
        let client = SeppClient::builder("http://127.0.0.1:1")
            .connect_lazy()
            .unwrap();
        let req = client.request_with_timeout((), Some(Duration::from_millis(29_998)));
        let v = req
            .metadata()
            .get("grpc-timeout")
            .expect("grpc-timeout is set");
        assert_eq!(v, "29998000u");
        assert!(
            v.is_sensitive(),
            "a varying grpc-timeout must not enter the HPACK table"
        );
        let req = client.request_with_timeout((), None);
        assert!(req.metadata().get("grpc-timeout").is_none());
    }
}
