//! A gRPC proxy in front of a test server, for the tests that need to see or disturb what a
//! client sends: it forwards the queue service and can lose replies, count settlements, record
//! and hold EnqueueBatch calls. A TCP relay in front of it can cut the client's connection.

// Each test file uses a part of this module.
#![allow(dead_code)]

use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_proto::v1::queue_service_server::{QueueService, QueueServiceServer};
use sepp_server::testing::TestServer;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use tokio::sync::{Semaphore, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What the proxy does besides forwarding; shared with the test, which reads and sets them.
#[derive(Default, Clone)]
pub(crate) struct Tamper {
    /// How many EnqueueBatch replies to lose (after the server committed the call).
    pub(crate) drop_enqueue_replies: Arc<AtomicU32>,
    /// Acks and nacks that passed.
    pub(crate) settlements: Arc<AtomicUsize>,
    /// Reserve calls that passed.
    pub(crate) reserves: Arc<AtomicUsize>,
    /// The `max_jobs` of each Reserve call that passed.
    pub(crate) reserve_max_jobs: Arc<Mutex<Vec<Option<u32>>>>,
    /// When set, each Reserve reply, once the server gave it, takes a permit from here before
    /// it goes back to the client; `reserve_replies_held` counts the replies that waited.
    pub(crate) reserve_reply_gate: Option<Arc<Semaphore>>,
    pub(crate) reserve_replies_held: Arc<watch::Sender<usize>>,
    /// When set, an Ack's `then_reserve` is removed before it is forwarded, as a server
    /// without the extension (the public sepp) ignores it: its reply has no `next`.
    pub(crate) strip_then_reserve: Arc<std::sync::atomic::AtomicBool>,
    /// Every EnqueueBatch call received, in order of arrival: how many of its jobs were keyed
    /// and how many were not. A watch, so that a test can await a number of calls.
    pub(crate) enqueue_batches: Arc<watch::Sender<Vec<BatchSeen>>>,
    /// When set, each EnqueueBatch call, once recorded, takes a permit from here before it is
    /// forwarded: the test holds batches in flight until it adds permits.
    pub(crate) enqueue_gate: Option<Arc<Semaphore>>,
}

/// One EnqueueBatch call as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchSeen {
    pub(crate) keyed: usize,
    pub(crate) unkeyed: usize,
}

impl BatchSeen {
    pub(crate) fn jobs(&self) -> usize {
        self.keyed + self.unkeyed
    }
}

impl Tamper {
    /// A tamper whose gate holds every EnqueueBatch call until permits are added.
    pub(crate) fn holding_enqueues() -> (Self, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let t = Tamper {
            enqueue_gate: Some(gate.clone()),
            ..Tamper::default()
        };
        (t, gate)
    }

    /// Waits until the proxy has received `n` EnqueueBatch calls; returns them all.
    pub(crate) async fn enqueue_batches_received(&self, n: usize) -> Vec<BatchSeen> {
        let mut rx = self.enqueue_batches.subscribe();
        rx.wait_for(|v| v.len() >= n).await.unwrap().clone()
    }
}

struct Proxy {
    upstream: QueueServiceClient<Channel>,
    tamper: Tamper,
}

#[tonic::async_trait]
impl QueueService for Proxy {
    async fn enqueue_batch(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let keyed = r
            .get_ref()
            .jobs
            .iter()
            .filter(|j| j.idempotency_key.is_some())
            .count();
        let seen = BatchSeen {
            keyed,
            unkeyed: r.get_ref().jobs.len() - keyed,
        };
        self.tamper.enqueue_batches.send_modify(|v| v.push(seen));
        if let Some(gate) = &self.tamper.enqueue_gate {
            gate.acquire().await.unwrap().forget();
        }
        let resp = self.upstream.clone().enqueue_batch(r.into_inner()).await?;
        if self
            .tamper
            .drop_enqueue_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("reply lost on the way back"));
        }
        Ok(resp)
    }
    async fn enqueue_atomic(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueAtomicResponse>, Status> {
        self.upstream.clone().enqueue_atomic(r.into_inner()).await
    }
    async fn reserve(
        &self,
        r: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        self.tamper.reserves.fetch_add(1, Ordering::SeqCst);
        self.tamper
            .reserve_max_jobs
            .lock()
            .unwrap()
            .push(r.get_ref().max_jobs);
        let reply = self.upstream.clone().reserve(r.into_inner()).await?;
        if let Some(gate) = &self.tamper.reserve_reply_gate {
            self.tamper.reserve_replies_held.send_modify(|n| *n += 1);
            gate.acquire().await.unwrap().forget();
        }
        Ok(reply)
    }
    async fn ack(&self, r: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.tamper.settlements.fetch_add(1, Ordering::SeqCst);
        let mut r = r.into_inner();
        if self.tamper.strip_then_reserve.load(Ordering::SeqCst) {
            r.then_reserve = None;
        }
        self.upstream.clone().ack(r).await
    }
    async fn nack(
        &self,
        r: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        self.tamper.settlements.fetch_add(1, Ordering::SeqCst);
        self.upstream.clone().nack(r.into_inner()).await
    }
    async fn extend(
        &self,
        r: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        self.upstream.clone().extend(r.into_inner()).await
    }
    async fn drain_dead_letters(
        &self,
        r: Request<pb::DrainDeadLettersRequest>,
    ) -> Result<Response<pb::DrainDeadLettersResponse>, Status> {
        self.upstream
            .clone()
            .drain_dead_letters(r.into_inner())
            .await
    }
    async fn get_server_info(
        &self,
        r: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        self.upstream.clone().get_server_info(r.into_inner()).await
    }
}

/// Starts a proxy in front of `server`; returns its URL.
pub(crate) async fn proxy(server: &TestServer, tamper: Tamper) -> String {
    let upstream = QueueServiceClient::connect(server.url()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(QueueServiceServer::new(Proxy { upstream, tamper }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

/// A TCP relay to `upstream` whose connections the test can cut or freeze; shared with the
/// test.
#[derive(Clone)]
pub(crate) struct Relay {
    /// The tasks copying each accepted connection; aborting one closes both its sockets.
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Once true, every connection stops carrying bytes but stays open (a network that drops
    /// packets without resetting anything).
    frozen: Arc<watch::Sender<bool>>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            conns: Arc::default(),
            frozen: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Relay {
    /// Starts relaying a local port to `upstream` (`http://host:port`); returns its URL.
    pub(crate) async fn start(&self, upstream: &str) -> String {
        let target = upstream.trim_start_matches("http://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = self.conns.clone();
        let frozen = self.frozen.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let mut frozen = frozen.subscribe();
                let task = tokio::spawn(async move {
                    let mut outbound = tokio::net::TcpStream::connect(target).await.unwrap();
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = async { frozen.wait_for(|f| *f).await.map(|_| ()) } => {
                            // Hold both sockets open, silent, until the task is aborted.
                            std::future::pending::<()>().await;
                        }
                    }
                });
                conns.lock().unwrap().push(task.abort_handle());
            }
        });
        format!("http://{addr}")
    }

    /// Stops every connection, those accepted later too, from carrying bytes, without closing
    /// any.
    pub(crate) fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Cuts every connection accepted so far; later connections are relayed as before.
    pub(crate) fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}
