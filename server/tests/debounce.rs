//! Debounce (`[[queues]] on_duplicate = "replace_pending"`), end to end over real gRPC: a hit
//! on a job that has not started replaces its payload; concurrent replacers racing a worker
//! never hand it a mix of two payloads, and the job runs once.

mod common;

use common::{Clients, TestServer};
use sepp_rs::{EnqueueRequest, ReserveOptions};
use sepp_server::config::{OnDuplicate, QueueConfig};
use std::sync::Arc;
use std::time::Duration;

/// Large enough that a torn write would show (several pages of one byte value).
const SIZE: usize = 64 * 1024;
const REPLACERS: u8 = 64;

fn debounced(c: &mut sepp_server::config::Config) {
    c.queues.push(QueueConfig {
        name: "deb".into(),
        on_duplicate: Some(OnDuplicate::ReplacePending),
        ..Default::default()
    });
}

/// Version `v` of the document: `SIZE` bytes of `v`, under one key.
fn version(v: u8) -> EnqueueRequest {
    EnqueueRequest::new("deb", "index")
        .unwrap()
        .with_idempotency_key("doc-1")
        .with_payload(vec![v; SIZE], "application/octet-stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_replacers_and_a_worker_see_one_whole_payload_and_one_run() {
    let server = TestServer::start(debounced).await;
    let client = server.client().await;
    let original = client.enqueue(version(0)).await.unwrap();
    assert!(!original.deduplicated);

    // 64 replacers and one worker start together.
    let start = Arc::new(tokio::sync::Barrier::new(usize::from(REPLACERS) + 1));
    let mut replacers = Vec::new();
    for v in 1..=REPLACERS {
        let (client, start) = (client.clone(), start.clone());
        replacers.push(tokio::spawn(async move {
            start.wait().await;
            (v, client.enqueue(version(v)).await.unwrap())
        }));
    }
    let worker = {
        let (client, start) = (client.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            client
                .reserve(
                    ReserveOptions::new(["deb"], Duration::from_secs(60))
                        .with_wait_timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap()
        })
    };
    let mut replaced = vec![0u8];
    for r in replacers {
        let (v, ack) = r.await.unwrap();
        assert_eq!(
            ack.job_id, original.job_id,
            "every replacer hits the one job"
        );
        assert!(ack.deduplicated);
        if ack.replaced {
            replaced.push(v);
        }
    }
    let jobs = worker.await.unwrap();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job.id, original.job_id);
    let data = &job.payload.as_ref().expect("a payload").data;
    assert_eq!(data.len(), SIZE, "the payload is whole");
    let v = data[0];
    assert!(data.iter().all(|b| *b == v), "one version, never a mix");
    assert!(
        replaced.contains(&v),
        "the worker saw version {v}, which no enqueue that replaced sent ({replaced:?})"
    );
    if replaced.len() > 1 {
        assert_ne!(
            v, 0,
            "a replacement happened before the lease, so the worker saw one"
        );
    }
    client.ack(&job.id, job.attempt).await.unwrap();
    // The job ran once: nothing more to reserve, and a hit now keeps the acked job.
    let again = client
        .reserve(ReserveOptions::new(["deb"], Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(again.is_empty(), "the job runs once");
    let late = client.enqueue(version(99)).await.unwrap();
    assert_eq!(late.job_id, original.job_id);
    assert!(late.deduplicated && !late.replaced);
}

#[tokio::test]
async fn a_hit_replaces_a_pending_job_and_says_so_and_a_plain_queue_keeps_it() {
    let server = TestServer::start(debounced).await;
    let client = server.client().await;
    let first = client.enqueue(version(1)).await.unwrap();
    let second = client.enqueue(version(2)).await.unwrap();
    assert_eq!(second.job_id, first.job_id);
    assert!(second.deduplicated && second.replaced);
    assert_eq!(second.original_state, Some(sepp_rs::admin::JobState::Ready));
    let plain = |v: u8| {
        EnqueueRequest::new("plain", "index")
            .unwrap()
            .with_idempotency_key("doc-1")
            .with_payload(vec![v; 4], "application/octet-stream")
    };
    client.enqueue(plain(1)).await.unwrap();
    let hit = client.enqueue(plain(2)).await.unwrap();
    assert!(hit.deduplicated && !hit.replaced);
    let jobs = client
        .reserve(ReserveOptions::new(["deb", "plain"], Duration::from_secs(60)).with_max_jobs(2))
        .await
        .unwrap();
    let first_bytes: Vec<u8> = jobs
        .iter()
        .map(|j| j.payload.as_ref().unwrap().data[0])
        .collect();
    assert_eq!(first_bytes, vec![2, 1], "replaced on deb, kept on plain");
}
