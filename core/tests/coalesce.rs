//! Coalescing of concurrent enqueues: callers of one client that wait while its batches are in
//! flight leave together in one EnqueueBatch, and each gets its own result. A proxy between
//! the client and a real in-process server records each EnqueueBatch call and can hold calls
//! in flight; a TCP relay in front of it can cut the connection.

mod common;

use common::{BatchSeen, Relay, Tamper};
use futures_util::future::join_all;
use sepp_rs::{EnqueueAck, EnqueueError, EnqueueRequest, ErrorCode, Rejection, SeppClient};
use sepp_server::testing::TestServer;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

type Call<'a> = Pin<Box<dyn Future<Output = Result<EnqueueAck, EnqueueError>> + Send + 'a>>;

/// Polls `call` once. The first poll of an enqueue checks the job, then puts it in the
/// client's queue or sends it: after it, the call is in the client's hands.
async fn poll_once(call: &mut Call<'_>) -> Poll<Result<EnqueueAck, EnqueueError>> {
    std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await
}

/// Runs a test body with a deadline, so that a missing batch fails the test instead of
/// hanging it.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("the test finished within 120 s")
}

fn unkeyed(job_type: &str) -> EnqueueRequest {
    EnqueueRequest::new("coalesced", job_type).unwrap()
}

fn keyed(job_type: &str) -> EnqueueRequest {
    unkeyed(job_type).with_idempotency_key(format!("key-{job_type}"))
}

/// A client straight to the server, for the admin calls the proxy does not forward.
async fn direct(server: &TestServer) -> SeppClient {
    SeppClient::connect(server.url()).await.unwrap()
}

/// A server behind a proxy that holds every EnqueueBatch call until the gate (a semaphore) has
/// permits, and a client through the proxy with one batch in flight at most.
async fn one_slot_behind_a_holding_proxy() -> (
    TestServer,
    Tamper,
    std::sync::Arc<tokio::sync::Semaphore>,
    SeppClient,
) {
    let server = TestServer::start(|_| {}).await;
    let (tamper, gate) = Tamper::holding_enqueues();
    let url = common::proxy(&server, tamper.clone()).await;
    let client = SeppClient::builder(url)
        .max_batches_in_flight(1)
        .connect()
        .await
        .unwrap();
    (server, tamper, gate, client)
}

/// A server behind a proxy that holds every EnqueueBatch call until the gate has permits, and a
/// client through the proxy with coalescing off.
async fn uncoalesced_behind_a_holding_proxy() -> (
    TestServer,
    Tamper,
    std::sync::Arc<tokio::sync::Semaphore>,
    SeppClient,
) {
    let server = TestServer::start(|_| {}).await;
    let (tamper, gate) = Tamper::holding_enqueues();
    let url = common::proxy(&server, tamper.clone()).await;
    let client = SeppClient::builder(url)
        .coalesce(false)
        .connect()
        .await
        .unwrap();
    (server, tamper, gate, client)
}

/// Keyed enqueues of `types`, each polled once: with the client's slot busy, each waits.
async fn waiting_keyed<'a>(client: &'a SeppClient, types: &[&str]) -> Vec<Call<'a>> {
    let mut calls: Vec<Call<'a>> = types
        .iter()
        .map(|t| Box::pin(client.enqueue(keyed(t))) as Call<'a>)
        .collect();
    for c in &mut calls {
        assert!(poll_once(c).await.is_pending());
    }
    calls
}

/// Checks, by idempotency key (`{prefix}{name}`), which jobs reached the server.
async fn assert_sent(server: &TestServer, prefix: &str, sent: &[&str], not_sent: &[&str]) {
    let admin = direct(server).await;
    for (names, expected) in [(sent, true), (not_sent, false)] {
        for name in names {
            let found = admin
                .lookup_idempotency_key("coalesced", &format!("{prefix}{name}"))
                .await
                .unwrap();
            assert_eq!(found.is_some(), expected, "{name}");
        }
    }
}

/// The job sizes of the EnqueueBatch calls the proxy has seen.
fn sizes(tamper: &Tamper) -> Vec<usize> {
    tamper
        .enqueue_batches
        .borrow()
        .iter()
        .map(BatchSeen::jobs)
        .collect()
}

/// Caller `i`'s job: a kind by `i % 4`, and the job type `t{i}`, by which the caller finds its
/// own job on the server.
enum Kind {
    Keyed,
    Unkeyed,
    /// Refused by the client's checks (a key over the advertised 256 bytes): never sent.
    InvalidBeforeSending,
    /// Rejected by the server in the batch (a payload over its 64 bytes), keyed or not.
    RejectedByServer,
}

fn kind(i: usize) -> Kind {
    match i % 4 {
        0 => Kind::Keyed,
        1 => Kind::Unkeyed,
        2 => Kind::InvalidBeforeSending,
        _ => Kind::RejectedByServer,
    }
}

fn request(i: usize) -> EnqueueRequest {
    let t = format!("t{i}");
    match kind(i) {
        Kind::Keyed => keyed(&t),
        Kind::Unkeyed => unkeyed(&t),
        Kind::InvalidBeforeSending => unkeyed(&t).with_idempotency_key("k".repeat(300)),
        Kind::RejectedByServer if i % 8 == 3 => keyed(&t).with_payload(vec![b'x'; 100], "raw"),
        Kind::RejectedByServer => unkeyed(&t).with_payload(vec![b'x'; 100], "raw"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_of_a_thousand_concurrent_mixed_enqueues_gets_its_own_result() {
    within(async {
        let server = TestServer::start(|c| c.limits.max_payload_bytes = 64).await;
        let (tamper, gate) = Tamper::holding_enqueues();
        let url = common::proxy(&server, tamper.clone()).await;
        let client = SeppClient::connect(url).await.unwrap();
        let max_batch = client.max_enqueue_batch().unwrap() as usize;
        const N: usize = 1_000;

        // Every call joins while the first batches are held at the proxy, so the others wait
        // in the client's queue. Jobs refused by the client's checks are answered at once.
        let mut results: Vec<Option<Result<EnqueueAck, EnqueueError>>> = vec![None; N];
        let mut waiting = Vec::new();
        for (i, result) in results.iter_mut().enumerate() {
            let mut call: Call<'_> = Box::pin(client.enqueue(request(i)));
            match poll_once(&mut call).await {
                Poll::Ready(r) => *result = Some(r),
                Poll::Pending => waiting.push((i, call)),
            }
        }
        for (i, r) in results.iter().enumerate() {
            assert_eq!(
                r.is_some(),
                matches!(kind(i), Kind::InvalidBeforeSending),
                "caller {i}: only jobs refused by the client's checks are answered before sending"
            );
        }
        gate.add_permits(1_000_000);
        for (i, r) in join_all(
            waiting
                .into_iter()
                .map(|(i, c)| async move { (i, c.await) }),
        )
        .await
        {
            results[i] = Some(r);
        }

        let admin = direct(&server).await;
        let mut ids = HashSet::new();
        for (i, r) in results.into_iter().enumerate() {
            let r = r.unwrap();
            match kind(i) {
                Kind::Keyed | Kind::Unkeyed => {
                    let ack = r.unwrap_or_else(|e| panic!("caller {i}: {e}"));
                    assert!(!ack.deduplicated, "caller {i}");
                    assert!(
                        ids.insert(ack.job_id.clone()),
                        "caller {i}: a shared job id"
                    );
                    let job = admin.get_job(&ack.job_id).await.unwrap();
                    assert_eq!(
                        job.job_type,
                        format!("t{i}"),
                        "caller {i} got another's job"
                    );
                    if let Kind::Keyed = kind(i) {
                        let by_key = admin
                            .lookup_idempotency_key("coalesced", &format!("key-t{i}"))
                            .await
                            .unwrap()
                            .unwrap();
                        assert_eq!(by_key.job_id, ack.job_id, "caller {i}");
                    }
                }
                Kind::InvalidBeforeSending => assert!(
                    matches!(
                        r,
                        Err(EnqueueError::Rejected(Rejection::IdempotencyKeyTooLong {
                            limit: 256,
                            actual: 300
                        }))
                    ),
                    "caller {i}: {r:?}"
                ),
                Kind::RejectedByServer => assert!(
                    matches!(
                        r,
                        Err(EnqueueError::Rejected(Rejection::PayloadTooLarge {
                            limit: 64,
                            actual: 100
                        }))
                    ),
                    "caller {i}: {r:?}"
                ),
            }
        }

        let seen = tamper.enqueue_batches.borrow().clone();
        let sent: usize = seen.iter().map(BatchSeen::jobs).sum();
        assert_eq!(sent, 750, "every job that passed the checks was sent once");
        assert!(
            seen.len() < sent,
            "{} calls for {sent} jobs: nothing coalesced",
            seen.len()
        );
        for b in &seen {
            assert!(
                b.keyed == 0 || b.unkeyed == 0,
                "keyed and unkeyed jobs shared a batch: {b:?}"
            );
            assert!(b.jobs() <= max_batch, "{b:?} is over max_enqueue_batch");
        }
    })
    .await;
}

#[tokio::test]
async fn a_connection_cut_mid_batch_fails_only_the_callers_of_that_batch() {
    within(async {
        let server = TestServer::start(|_| {}).await;
        let (tamper, gate) = Tamper::holding_enqueues();
        let proxy = common::proxy(&server, tamper.clone()).await;
        let relay = Relay::default();
        let url = relay.start(&proxy).await;
        let client = SeppClient::builder(url)
            .max_batches_in_flight(1)
            .connect()
            .await
            .unwrap();

        // The first batch is in flight, held at the proxy; the next callers wait behind it.
        let mut first: Call<'_> = Box::pin(client.enqueue(unkeyed("first")));
        assert!(poll_once(&mut first).await.is_pending());
        tamper.enqueue_batches_received(1).await;
        let mut next: Vec<Call<'_>> = (0..5)
            .map(|i| Box::pin(client.enqueue(unkeyed(&format!("next{i}")))) as Call<'_>)
            .collect();
        for c in &mut next {
            assert!(poll_once(c).await.is_pending());
        }

        relay.cut();
        // An unkeyed batch cut off after it was sent is not retried: it may have committed.
        let e = first.await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Transport, "{e}");
        gate.add_permits(1_000);
        let admin = direct(&server).await;
        for (i, c) in next.into_iter().enumerate() {
            let ack = c.await.unwrap_or_else(|e| panic!("caller next{i}: {e}"));
            let job = admin.get_job(&ack.job_id).await.unwrap();
            assert_eq!(job.job_type, format!("next{i}"));
        }
        assert_eq!(sizes(&tamper), [1, 5]);
    })
    .await;
}

#[tokio::test]
async fn a_caller_that_gives_up_before_its_batch_leaves_is_not_sent() {
    within(async {
        let (server, tamper, gate, client) = one_slot_behind_a_holding_proxy().await;

        let mut first: Call<'_> = Box::pin(client.enqueue(keyed("first")));
        assert!(poll_once(&mut first).await.is_pending());
        tamper.enqueue_batches_received(1).await;
        let mut waiting = waiting_keyed(&client, &["a", "gives-up", "b"]).await;
        drop(waiting.remove(1));

        gate.add_permits(1_000);
        first.await.unwrap();
        for c in waiting {
            c.await.unwrap();
        }
        assert_eq!(sizes(&tamper), [1, 2]);
        // "gives-up" gave up before its batch left: never sent.
        assert_sent(&server, "key-", &["first", "a", "b"], &["gives-up"]).await;
    })
    .await;
}

#[tokio::test]
async fn a_lone_caller_that_gives_up_in_flight_frees_its_slot_for_those_waiting() {
    within(async {
        let (_server, tamper, gate, client) = one_slot_behind_a_holding_proxy().await;

        // A lone call on an idle client runs in its caller's future and holds the only slot.
        let mut lone: Call<'_> = Box::pin(client.enqueue(unkeyed("lone")));
        assert!(poll_once(&mut lone).await.is_pending());
        tamper.enqueue_batches_received(1).await;
        let waiting = waiting_keyed(&client, &["a", "b"]).await;
        // Its caller gives up while the call is held: the slot goes to those waiting, who
        // leave together (the lone job may or may not have been committed, as with a unary
        // call cut off).
        drop(lone);
        gate.add_permits(1_000);
        for c in waiting {
            c.await.unwrap();
        }
        assert_eq!(sizes(&tamper), [1, 2]);
    })
    .await;
}

#[tokio::test]
async fn a_lone_enqueue_on_an_idle_client_goes_out_alone_at_once() {
    within(async {
        let server = TestServer::start(|_| {}).await;
        let (tamper, gate) = Tamper::holding_enqueues();
        let url = common::proxy(&server, tamper.clone()).await;
        let client = SeppClient::connect(url).await.unwrap();

        let mut lone: Call<'_> = Box::pin(client.enqueue(unkeyed("lone")));
        assert!(poll_once(&mut lone).await.is_pending());
        // It reaches the server while no other call exists: nothing held it back to wait for
        // company.
        assert_eq!(
            tamper.enqueue_batches_received(1).await,
            [BatchSeen {
                keyed: 0,
                unkeyed: 1
            }]
        );
        gate.add_permits(1_000);
        lone.await.unwrap();
        client.enqueue(keyed("after")).await.unwrap();
        assert_eq!(sizes(&tamper), [1, 1]);
    })
    .await;
}

#[tokio::test]
async fn with_coalescing_off_each_enqueue_is_its_own_call() {
    within(async {
        let (_server, tamper, gate, client) = uncoalesced_behind_a_holding_proxy().await;

        let mut calls: Vec<Call<'_>> = (0..20)
            .map(|i| Box::pin(client.enqueue(keyed(&format!("off{i}")))) as Call<'_>)
            .collect();
        for c in &mut calls {
            assert!(poll_once(c).await.is_pending());
        }
        // All twenty are in flight at once, each its own call (coalescing would hold all but
        // max_batches_in_flight of them back, and this would never return).
        tamper.enqueue_batches_received(20).await;
        gate.add_permits(1_000);
        for c in calls {
            c.await.unwrap();
        }
        assert_eq!(sizes(&tamper), [1; 20]);
    })
    .await;
}

/// `enqueue_with`: the answer comes through a callback, for callers that are not tokio tasks.
fn answered(
    client: &SeppClient,
    request: EnqueueRequest,
) -> (
    sepp_rs::EnqueueHandle,
    tokio::sync::oneshot::Receiver<Result<EnqueueAck, EnqueueError>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let handle = client.enqueue_with(&tokio::runtime::Handle::current(), request, move |r| {
        tx.send(r).unwrap();
    });
    (handle, rx)
}

#[tokio::test]
async fn enqueue_with_answers_each_caller_through_its_callback_and_cancelled_ones_are_not_sent() {
    within(async {
        let (server, tamper, gate, client) = one_slot_behind_a_holding_proxy().await;

        // On an idle client the first call leaves at once, alone, and holds the only slot.
        let (_first, first) = answered(&client, keyed("cb-first"));
        tamper.enqueue_batches_received(1).await;
        let (_a, a) = answered(&client, keyed("cb-a"));
        let (gives_up, gave_up) = answered(&client, keyed("cb-gives-up"));
        let (_b, b) = answered(&client, keyed("cb-b"));
        // A job refused by the checks before sending is answered at once, on this thread.
        let (_bad, mut bad) = answered(
            &client,
            unkeyed("cb-bad").with_idempotency_key("k".repeat(300)),
        );
        assert!(matches!(bad.try_recv(), Ok(Err(EnqueueError::Rejected(_)))));
        gives_up.cancel();

        gate.add_permits(1_000);
        let mut ids = HashSet::new();
        for rx in [first, a, b] {
            let ack = rx.await.expect("answered").expect("enqueued");
            assert!(ids.insert(ack.job_id));
        }
        // The cancelled caller's callback is dropped uncalled, and its job never left.
        assert!(gave_up.await.is_err());
        assert_eq!(sizes(&tamper), [1, 2]);
        // "gives-up" gave up before its batch left: never sent.
        assert_sent(&server, "key-cb-", &["first", "a", "b"], &["gives-up"]).await;
    })
    .await;
}

#[tokio::test]
async fn enqueue_with_on_a_client_without_coalescing_makes_one_call_per_job() {
    within(async {
        let (_server, tamper, gate, client) = uncoalesced_behind_a_holding_proxy().await;
        let calls: Vec<_> = (0..5)
            .map(|i| answered(&client, keyed(&format!("nc{i}"))))
            .collect();
        // All five are in flight at once, each its own call (coalescing would hold all but
        // max_batches_in_flight of them back, and this would never return).
        tamper.enqueue_batches_received(5).await;
        gate.add_permits(1_000);
        let mut ids = HashSet::new();
        for (_handle, rx) in calls {
            assert!(ids.insert(rx.await.unwrap().unwrap().job_id));
        }
        assert_eq!(sizes(&tamper), [1; 5]);
    })
    .await;
}
