//! `kill -9` durability of the real binary: every acknowledged keyed enqueue survives, and its
//! dedup record still answers with the original id after restart.

mod common;

use common::ServerProcess;
use sepp_rs::{EnqueueRequest, SeppClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

async fn acked_keys_survive_kill_9(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[storage]\npersist_mode = \"{mode}\"\n",
        dir.path().join("data").display()
    );
    let mut server = ServerProcess::start(dir.path(), &toml);
    let url = server.url();
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let mut producers = Vec::new();
    for p in 0..16 {
        let url = url.clone();
        let acked = acked.clone();
        producers.push(tokio::spawn(async move {
            let client = SeppClient::connect(url).await.expect("connect");
            for i in 0.. {
                let key = format!("p{p}-{i}");
                let req = EnqueueRequest::new("durable", "t")
                    .unwrap()
                    .with_payload(vec![1u8; 256], "application/octet-stream")
                    .with_idempotency_key(key.clone());
                match client.enqueue(req).await {
                    Ok(ack) => {
                        acked.lock().unwrap().insert(key, ack.job_id);
                    }
                    // The server is gone: stop.
                    Err(_) => return,
                }
            }
        }));
    }
    // Let the producers run, then kill the server mid-stream.
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if acked.lock().unwrap().len() >= 500 {
            break;
        }
    }
    server.kill9();
    for p in producers {
        let _ = tokio::time::timeout(Duration::from_secs(30), p).await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 500);

    let server = ServerProcess::start(dir.path(), &toml);
    let client = SeppClient::connect(server.url()).await.unwrap();
    for (key, id) in &acked {
        let ack = client
            .enqueue(
                EnqueueRequest::new("durable", "t")
                    .unwrap()
                    .with_idempotency_key(key.clone()),
            )
            .await
            .unwrap();
        assert!(
            ack.deduplicated,
            "{mode}: key {key} was forgotten after kill -9"
        );
        assert_eq!(&ack.job_id, id, "{mode}: key {key} now names another job");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_keyed_enqueues_survive_kill_9_with_sync_all() {
    acked_keys_survive_kill_9("sync_all").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_keyed_enqueues_survive_kill_9_with_sync_data() {
    acked_keys_survive_kill_9("sync_data").await;
}

/// Mixed load: producers enqueue keyed jobs while workers reserve and ack them; `kill -9`;
/// restart. No acknowledged enqueue is lost, and no job whose ack was acknowledged is
/// delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_mixed_load_loses_no_job_and_redelivers_no_acked_one() {
    use sepp_rs::ReserveOptions;
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[storage]\npersist_mode = \"sync_all\"\n",
        dir.path().join("data").display()
    );
    let mut server = ServerProcess::start(dir.path(), &toml);
    let url = server.url();
    let enqueued: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let ack_tried: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for p in 0..8 {
        let (url, enqueued) = (url.clone(), enqueued.clone());
        tasks.push(tokio::spawn(async move {
            let client = SeppClient::connect(url).await.expect("connect");
            for i in 0.. {
                let key = format!("p{p}-{i}");
                let req = EnqueueRequest::new("mixed", "t")
                    .unwrap()
                    .with_idempotency_key(key.clone());
                match client.enqueue(req).await {
                    Ok(ack) => {
                        enqueued.lock().unwrap().insert(key, ack.job_id);
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    for _ in 0..8 {
        let (url, acked, ack_tried) = (url.clone(), acked.clone(), ack_tried.clone());
        tasks.push(tokio::spawn(async move {
            let client = SeppClient::connect(url).await.expect("connect");
            loop {
                let opts = ReserveOptions::new(["mixed"], Duration::from_secs(1))
                    .with_wait_timeout(Duration::from_millis(200))
                    .with_max_jobs(4);
                let Ok(jobs) = client.reserve(opts).await else {
                    return;
                };
                for j in jobs {
                    ack_tried.lock().unwrap().insert(j.id.clone());
                    match client.ack(&j.id, j.attempt).await {
                        Ok(()) => {
                            acked.lock().unwrap().insert(j.id);
                        }
                        Err(e) if e.is_lease_lost() => {}
                        Err(_) => return,
                    }
                }
            }
        }));
    }
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if enqueued.lock().unwrap().len() >= 600 && acked.lock().unwrap().len() >= 200 {
            break;
        }
    }
    server.kill9();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    let enqueued = enqueued.lock().unwrap().clone();
    let acked = acked.lock().unwrap().clone();
    let ack_tried = ack_tried.lock().unwrap().clone();

    let server = ServerProcess::start(dir.path(), &toml);
    let client = SeppClient::connect(server.url()).await.unwrap();
    for (key, id) in &enqueued {
        let ack = client
            .enqueue(
                EnqueueRequest::new("mixed", "t")
                    .unwrap()
                    .with_idempotency_key(key.clone()),
            )
            .await
            .unwrap();
        assert!(ack.deduplicated && &ack.job_id == id, "key {key} lost");
    }
    // Drain everything: in-flight jobs come back when their 1 s leases run out.
    let mut delivered = HashSet::new();
    loop {
        let jobs = client
            .reserve(
                ReserveOptions::new(["mixed"], Duration::from_secs(30))
                    .with_wait_timeout(Duration::from_millis(2_500))
                    .with_max_jobs(100),
            )
            .await
            .unwrap();
        if jobs.is_empty() {
            break;
        }
        for j in jobs {
            assert!(
                !acked.contains(&j.id),
                "job {} was acked before the crash and delivered again",
                j.id
            );
            client.ack(&j.id, j.attempt).await.unwrap();
            delivered.insert(j.id);
        }
    }
    for id in enqueued.values() {
        assert!(
            acked.contains(id) || delivered.contains(id) || ack_tried.contains(id),
            "job {id} was acknowledged at enqueue but never delivered after the crash"
        );
    }
}
