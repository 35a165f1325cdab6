//! API keys from `auth.api_keys_file`: reloaded on SIGHUP by a real server process, removed
//! keys accepted for `auth.rotation_overlap_ms`, and roles (`PERMISSION_DENIED` naming the
//! role a call needs).

mod common;

use common::{Clients, TempDir, TestServer};
use sepp_proto::admin::v1 as admin;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_server::config::{ApiKey, Role};
use sepp_server::testing::ServerProcess;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

fn with_key<T>(msg: T, key: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {key}")).unwrap(),
    );
    r
}

async fn raw(url: String) -> QueueServiceClient<Channel> {
    QueueServiceClient::connect(url).await.expect("connect")
}

/// The status code of GetServerInfo with `key` (`Ok` on success).
async fn info(client: &mut QueueServiceClient<Channel>, key: &str) -> Code {
    match client
        .get_server_info(with_key(pb::GetServerInfoRequest {}, key))
        .await
    {
        Ok(_) => Code::Ok,
        Err(e) => e.code(),
    }
}

fn enqueue_one() -> pb::EnqueueBatchRequest {
    pb::EnqueueBatchRequest {
        jobs: vec![pb::EnqueueRequest {
            queue: "q".into(),
            job_type: "t".into(),
            ..Default::default()
        }],
    }
}

fn reserve_one() -> pb::ReserveRequest {
    pb::ReserveRequest {
        queues: vec!["q".into()],
        max_jobs: Some(1),
        lease_duration: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        wait_timeout: Some(prost_types::Duration::default()),
        ..Default::default()
    }
}

fn write_keys(path: &Path, keys: &[(&str, &str, &str)]) {
    let mut text = String::new();
    for (name, key, roles) in keys {
        text.push_str(&format!(
            "[[api_keys]]\nname = \"{name}\"\nkey = \"{key}\"\nroles = {roles}\n\n"
        ));
    }
    // Written then renamed, so the server never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn sighup(server: &ServerProcess) {
    let ok = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(server.child.id().to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -HUP failed");
}

/// Polls GetServerInfo with `key` until it answers `want`, for at most 20 s.
async fn wait_for(client: &mut QueueServiceClient<Channel>, key: &str, want: Code) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = info(client, key).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "key {key:?}: still {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn process_config(dir: &Path, overlap_ms: u64) -> String {
    format!(
        "[server]\ndb_path = {:?}\n[storage]\npersist_mode = \"buffer\"\n[auth]\napi_keys_file = {:?}\nrotation_overlap_ms = {overlap_ms}\n",
        dir.join("data"),
        dir.join("keys.toml"),
    )
}

#[tokio::test]
async fn sighup_reloads_the_key_file_and_removed_keys_stay_valid_for_the_overlap() {
    let dir = TempDir::new();
    let keys = dir.path().join("keys.toml");
    write_keys(&keys, &[("first", "key-one", "[\"producer\", \"worker\"]")]);
    let server = common::ServerProcess::start(dir.path(), &process_config(dir.path(), 3_600_000));
    let mut client = raw(server.url()).await;
    assert_eq!(info(&mut client, "key-one").await, Code::Ok);
    assert_eq!(info(&mut client, "key-two").await, Code::Unauthenticated);

    // Rotate: key-two replaces key-one.
    write_keys(&keys, &[("second", "key-two", "[\"producer\"]")]);
    sighup(&server);
    wait_for(&mut client, "key-two", Code::Ok).await;
    // Removed, but inside the hour of overlap: still accepted, with the roles it had.
    assert_eq!(info(&mut client, "key-one").await, Code::Ok);
    client
        .enqueue_batch(with_key(enqueue_one(), "key-one"))
        .await
        .expect("the retired key keeps its producer role");
    let r = client
        .reserve(with_key(reserve_one(), "key-one"))
        .await
        .expect("the retired key keeps its worker role");
    assert_eq!(r.into_inner().jobs.len(), 1);
    // The new key has only the producer role.
    let e = client
        .reserve(with_key(reserve_one(), "key-two"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("\"worker\""), "{}", e.message());

    // A file that does not load leaves the keys in force.
    std::fs::write(&keys, "[[api_keys]]\nname = \"x\"\nkey = \"\"\n").unwrap();
    sighup(&server);
    // Then a good file: the server is still up and reloads it, so the bad one was survived.
    write_keys(
        &keys,
        &[
            ("second", "key-two", "[\"producer\", \"worker\"]"),
            ("third", "key-three", "[\"producer\"]"),
        ],
    );
    sighup(&server);
    wait_for(&mut client, "key-three", Code::Ok).await;
    assert_eq!(info(&mut client, "key-two").await, Code::Ok);
    // Roles are reloaded too: key-two may now reserve.
    client
        .reserve(with_key(reserve_one(), "key-two"))
        .await
        .expect("key-two gained the worker role");
    assert_eq!(info(&mut client, "key-one").await, Code::Ok);
}

#[tokio::test]
async fn with_no_overlap_a_removed_key_is_refused_at_once() {
    let dir = TempDir::new();
    let keys = dir.path().join("keys.toml");
    write_keys(&keys, &[("first", "key-one", "[\"producer\"]")]);
    let server = common::ServerProcess::start(dir.path(), &process_config(dir.path(), 0));
    let mut client = raw(server.url()).await;
    assert_eq!(info(&mut client, "key-one").await, Code::Ok);
    write_keys(&keys, &[("second", "key-two", "[\"producer\"]")]);
    sighup(&server);
    wait_for(&mut client, "key-two", Code::Ok).await;
    assert_eq!(info(&mut client, "key-one").await, Code::Unauthenticated);
}

#[tokio::test]
async fn a_removed_key_is_refused_once_the_overlap_is_over() {
    let dir = TempDir::new();
    let keys = dir.path().join("keys.toml");
    write_keys(&keys, &[("first", "key-one", "[\"producer\"]")]);
    let server = common::ServerProcess::start(dir.path(), &process_config(dir.path(), 300));
    let mut client = raw(server.url()).await;
    write_keys(&keys, &[("second", "key-two", "[\"producer\"]")]);
    let reloaded = Instant::now();
    sighup(&server);
    wait_for(&mut client, "key-two", Code::Ok).await;
    wait_for(&mut client, "key-one", Code::Unauthenticated).await;
    assert!(
        reloaded.elapsed() >= Duration::from_millis(300),
        "refused before the overlap was over"
    );
}

#[tokio::test]
async fn a_key_file_that_does_not_load_stops_the_start_naming_the_file() {
    let dir = TempDir::new();
    let keys = dir.path().join("keys.toml");
    std::fs::write(
        &keys,
        "[[api_keys]]\nname = \"a\"\nkey = \"k\"\nroles = [\"boss\"]\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("sepp.toml"), process_config(dir.path(), 0)).unwrap();
    let out = std::process::Command::new(common::sepp_bin())
        .arg("--config")
        .arg(dir.path().join("sepp.toml"))
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("keys.toml"), "{err}");
    assert!(err.contains("api_keys[0].roles"), "{err}");
}

fn key(name: &str, secret: &str, roles: &[Role]) -> ApiKey {
    ApiKey {
        name: name.into(),
        key: secret.into(),
        roles: roles.to_vec(),
    }
}

#[tokio::test]
async fn each_call_needs_its_role_and_a_refusal_names_it() {
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![
            key("prod", "p", &[Role::Producer]),
            key("work", "w", &[Role::Worker]),
            key("ops", "a", &[Role::Admin]),
            key("none", "n", &[]),
            ApiKey::new("all", "all"),
        ]);
    })
    .await;
    let mut q = server.raw().await;
    let mut adm = AdminServiceClient::connect(server.url()).await.unwrap();
    let denied = |r: Result<(), tonic::Status>, role: &str| {
        let e = r.expect_err("a lesser role is refused");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains(&format!("\"{role}\"")),
            "{}",
            e.message()
        );
    };
    // Enqueue: producer.
    for k in ["w", "a", "n"] {
        denied(
            q.enqueue_batch(with_key(enqueue_one(), k)).await.map(drop),
            "producer",
        );
        denied(
            q.enqueue_atomic(with_key(enqueue_one(), k)).await.map(drop),
            "producer",
        );
    }
    q.enqueue_batch(with_key(enqueue_one(), "p")).await.unwrap();
    q.enqueue_batch(with_key(enqueue_one(), "all"))
        .await
        .unwrap();
    // Reserve, Ack, Nack, Extend: worker.
    for k in ["p", "a", "n"] {
        denied(
            q.reserve(with_key(reserve_one(), k)).await.map(drop),
            "worker",
        );
        denied(
            q.ack(with_key(pb::AckRequest::default(), k))
                .await
                .map(drop),
            "worker",
        );
        denied(
            q.nack(with_key(pb::NackRequest::default(), k))
                .await
                .map(drop),
            "worker",
        );
        denied(
            q.extend(with_key(pb::ExtendRequest::default(), k))
                .await
                .map(drop),
            "worker",
        );
    }
    let jobs = q
        .reserve(with_key(reserve_one(), "w"))
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    // DrainDeadLetters and the admin service: admin.
    for k in ["p", "w", "n"] {
        denied(
            q.drain_dead_letters(with_key(pb::DrainDeadLettersRequest::default(), k))
                .await
                .map(drop),
            "admin",
        );
        denied(
            adm.get_queue_stats(with_key(
                admin::GetQueueStatsRequest { queue: "q".into() },
                k,
            ))
            .await
            .map(drop),
            "admin",
        );
        denied(
            adm.pause_queue(with_key(admin::PauseQueueRequest { queue: "q".into() }, k))
                .await
                .map(drop),
            "admin",
        );
    }
    adm.get_queue_stats(with_key(
        admin::GetQueueStatsRequest { queue: "q".into() },
        "a",
    ))
    .await
    .unwrap();
    // GetServerInfo: any known key, even one without a role.
    for k in ["p", "w", "a", "n", "all"] {
        assert_eq!(info(&mut q, k).await, Code::Ok, "{k}");
    }
    // An unknown key is still UNAUTHENTICATED, whatever the call.
    assert_eq!(info(&mut q, "nope").await, Code::Unauthenticated);
}
