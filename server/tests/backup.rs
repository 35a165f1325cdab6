//! Online backup: `sepp backup DIR` against a running server process under load, then a server
//! started on DIR has every job and idempotency key acknowledged before the backup began.

mod common;

use sepp_proto::admin::v1 as admin;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

const ADMIN_KEY: &str = "h15k-admin";

fn with_key<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {ADMIN_KEY}")).unwrap(),
    );
    r
}

fn config(db: &Path) -> String {
    format!(
        "[server]\ndb_path = {db:?}\n[storage]\npersist_mode = \"sync_all\"\n[auth]\napi_keys = [{{ name = \"ops\", key = \"{ADMIN_KEY}\" }}]\n"
    )
}

async fn enqueue(q: &mut QueueServiceClient<Channel>, key: &str) -> Result<String, String> {
    let r = q
        .enqueue_batch(with_key(pb::EnqueueBatchRequest {
            jobs: vec![pb::EnqueueRequest {
                queue: "bq".into(),
                job_type: "t".into(),
                idempotency_key: Some(key.into()),
                payload: Some(pb::Payload {
                    data: key.as_bytes().to_vec(),
                    encoding: "text/plain".into(),
                }),
                ..Default::default()
            }],
        }))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    match r.results[0].outcome.clone() {
        Some(pb::job_result::Outcome::Success(s)) => Ok(s.job_id),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test]
async fn a_server_restored_from_an_online_backup_has_every_acknowledged_job_and_key() {
    let dir = common::TempDir::new();
    let live_dir = dir.path().join("live");
    std::fs::create_dir_all(&live_dir).unwrap();
    let mut live = common::ServerProcess::start(&live_dir, &config(&live_dir.join("data")));
    let mut q = QueueServiceClient::connect(live.url()).await.unwrap();

    // Before the backup: 200 keyed jobs, and 20 of them reserved and acked.
    let mut before: HashMap<String, String> = HashMap::new();
    for i in 0..200 {
        let key = format!("before-{i}");
        let id = enqueue(&mut q, &key).await.unwrap();
        before.insert(key, id);
    }
    let got = q
        .reserve(with_key(pb::ReserveRequest {
            queues: vec!["bq".into()],
            max_jobs: Some(20),
            lease_duration: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            wait_timeout: Some(prost_types::Duration::default()),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(got.len(), 20);
    let mut acked = Vec::new();
    for j in &got {
        q.ack(with_key(pb::AckRequest {
            job_id: j.id.clone(),
            attempt: j.attempt,
            ..Default::default()
        }))
        .await
        .unwrap();
        acked.push(j.id.clone());
    }

    // Producers keep writing while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let during = Arc::new(Mutex::new(0u64));
    let producer = {
        let stop = stop.clone();
        let during = during.clone();
        let mut q = q.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                if enqueue(&mut q, &format!("during-{i}")).await.is_ok() {
                    *during.lock().unwrap() += 1;
                }
                i += 1;
            }
        })
    };
    // Let the producer get going: wait until it has written something.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while *during.lock().unwrap() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "producer made no progress"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    let backup_dir = dir.path().join("backup");
    let out = {
        let (bin, backup_dir, url) = (common::sepp_bin(), backup_dir.clone(), live.url());
        tokio::task::spawn_blocking(move || {
            // The server is on a random port, named by the global --server as for every other
            // subcommand (not the default 127.0.0.1:50051).
            std::process::Command::new(bin)
                .arg("backup")
                .arg(&backup_dir)
                .arg("--server")
                .arg(url)
                .env_remove("SEPP_SERVER")
                .env_remove("SEPP_ADDR")
                .env("SEPP_API_KEY", ADMIN_KEY)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert!(
        out.status.success(),
        "sepp backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("backup written to"), "{stdout}");
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    assert!(*during.lock().unwrap() > 0);

    // A second backup into the same (now non-empty) directory is refused, naming it. The
    // server comes from the deprecated --addr this time, which still works with a warning.
    let again = std::process::Command::new(common::sepp_bin())
        .arg("backup")
        .arg(&backup_dir)
        .arg("--addr")
        .arg(live.url())
        .env_remove("SEPP_SERVER")
        .env_remove("SEPP_ADDR")
        .env("SEPP_API_KEY", ADMIN_KEY)
        .output()
        .unwrap();
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("InvalidArgument") && err.contains("not empty"),
        "{err}"
    );
    assert!(err.contains("--addr is deprecated"), "{err}");

    // SEPP_ADDR is no longer read: one naming another server than --server is refused, before
    // any call, instead of silently backing up the other one.
    let other = std::process::Command::new(common::sepp_bin())
        .arg("backup")
        .arg(dir.path().join("never"))
        .arg("--server")
        .arg(live.url())
        .env("SEPP_ADDR", "http://127.0.0.1:1")
        .env("SEPP_API_KEY", ADMIN_KEY)
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(1));
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(
        err.contains("SEPP_ADDR=http://127.0.0.1:1 is no longer read")
            && err.contains("SEPP_SERVER"),
        "{err}"
    );
    assert!(!dir.path().join("never").exists());

    live.kill9();

    // Restore: a server on the backup directory.
    let restored_dir = dir.path().join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    let restored = common::ServerProcess::start(&restored_dir, &config(&backup_dir));
    let mut q = QueueServiceClient::connect(restored.url()).await.unwrap();
    let mut adm = AdminServiceClient::connect(restored.url()).await.unwrap();
    for (key, id) in &before {
        let found = adm
            .lookup_idempotency_key(with_key(admin::LookupIdempotencyKeyRequest {
                queue: "bq".into(),
                idempotency_key: key.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(found.found, "key {key} missing from the restored server");
        assert_eq!(&found.job_id, id);
        // The same keyed enqueue is deduplicated to the same job.
        assert_eq!(enqueue(&mut q, key).await.as_ref(), Ok(id));
    }
    // Every acknowledged, unacked job is delivered by the restored server; no acked one is.
    let mut delivered = Vec::new();
    loop {
        let jobs = q
            .reserve(with_key(pb::ReserveRequest {
                queues: vec!["bq".into()],
                max_jobs: Some(256),
                lease_duration: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                wait_timeout: Some(prost_types::Duration::default()),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .jobs;
        if jobs.is_empty() {
            break;
        }
        delivered.extend(jobs.into_iter().map(|j| j.id));
    }
    for (key, id) in &before {
        if acked.contains(id) {
            assert!(!delivered.contains(id), "acked job {key} delivered again");
        } else {
            assert!(delivered.contains(id), "job {key} not delivered");
        }
    }
}
