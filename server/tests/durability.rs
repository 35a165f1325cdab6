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
