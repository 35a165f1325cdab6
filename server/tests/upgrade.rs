//! Upgrades: a data directory written by each released on-disk format of the embedded store
//! opens, and every record in it reads back; a newer format is refused.
//!
//! Each fixture `tests/fixtures/embedded-v<N>/` (format version N) was written by
//! `write_the_fixture` below, through a real server of that format: `data/` is the data
//! directory, and `manifest.toml` lists what the server acknowledged. A new format writes its
//! own directory (old ones are never rewritten):
//! `SEPP_TEST_WRITE_FIXTURE=1 cargo nextest run -p sepp-server --test upgrade --run-ignored only`.

mod common;

use common::TestServer;
use sepp_proto::admin::v1 as admin;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const TEN_YEARS_MS: u64 = 3650 * 86_400_000;

/// The format this build writes (`FORMAT_VERSION` in the embedded store's codec).
const CURRENT_FORMAT: u32 = 3;

fn fixture_dir(format: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/embedded-v{format}"))
}

/// What the fixture holds: every job the server acknowledged, as the test expects to find it.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format_version: u32,
    jobs: Vec<FixtureJob>,
    paused_queues: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FixtureJob {
    id: String,
    queue: String,
    job_type: String,
    payload: String,
    priority: u32,
    idempotency_key: Option<String>,
    /// `ready`, `scheduled`, `in_flight`, `dead_lettered` or `acked`.
    state: String,
    attempt: u32,
    max_attempts: u32,
}

fn config(c: &mut sepp_server::config::Config) {
    c.storage.dead_letter_retention_ms = TEN_YEARS_MS;
    c.storage.dedup_window_ms = TEN_YEARS_MS;
    c.storage.persist_mode = sepp_server::config::PersistMode::SyncAll;
    c.limits.max_schedule_horizon_ms = TEN_YEARS_MS;
}

fn job(queue: &str, job_type: &str, payload: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        job_type: job_type.into(),
        payload: Some(pb::Payload {
            data: payload.as_bytes().to_vec(),
            encoding: "text/plain".into(),
        }),
        ..Default::default()
    }
}

async fn enqueue(
    q: &mut pb::queue_service_client::QueueServiceClient<tonic::transport::Channel>,
    r: pb::EnqueueRequest,
) -> String {
    let res = q
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![r] })
        .await
        .unwrap()
        .into_inner();
    match res.results[0].outcome.clone().unwrap() {
        pb::job_result::Outcome::Success(s) => s.job_id,
        other => panic!("rejected: {other:?}"),
    }
}

/// Reserves up to 10 jobs of `queue` without waiting, under a 300 s lease.
async fn reserve(
    q: &mut pb::queue_service_client::QueueServiceClient<tonic::transport::Channel>,
    queue: &str,
) -> Vec<pb::Job> {
    q.reserve(reserve_request(queue))
        .await
        .unwrap()
        .into_inner()
        .jobs
}

fn reserve_request(queue: &str) -> pb::ReserveRequest {
    pb::ReserveRequest {
        queues: vec![queue.into()],
        max_jobs: Some(10),
        lease_duration: Some(prost_types::Duration {
            seconds: 300,
            nanos: 0,
        }),
        wait_timeout: Some(prost_types::Duration::default()),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "writes the committed fixture; run with SEPP_TEST_WRITE_FIXTURE=1"]
async fn write_the_fixture() {
    if std::env::var_os("SEPP_TEST_WRITE_FIXTURE").is_none() {
        return;
    }
    let server = TestServer::start(config).await;
    let mut q = common::Clients::raw(&server).await;
    let mut adm = AdminServiceClient::connect(server.url()).await.unwrap();
    let mut jobs = Vec::new();
    let mut push = |id: String, r: &pb::EnqueueRequest, state: &str, attempt: u32| {
        jobs.push(FixtureJob {
            id,
            queue: r.queue.clone(),
            job_type: r.job_type.clone(),
            payload: String::from_utf8(r.payload.clone().unwrap().data).unwrap(),
            priority: r.priority.unwrap_or(0),
            idempotency_key: r.idempotency_key.clone(),
            state: state.into(),
            attempt,
            max_attempts: r.max_attempts.unwrap_or(3),
        });
    };

    // Ready: keyed with a priority and a custom entry, and unkeyed.
    let mut a = job("fx-ready", "email", "alpha");
    a.idempotency_key = Some("key-a".into());
    a.priority = Some(5);
    a.custom.insert(
        "tenant".into(),
        pb::PrimitiveValue {
            value: Some(pb::primitive_value::Value::StringValue("acme".into())),
        },
    );
    let id = enqueue(&mut q, a.clone()).await;
    push(id, &a, "ready", 0);
    let b = job("fx-ready", "email", "beta");
    let id = enqueue(&mut q, b.clone()).await;
    push(id, &b, "ready", 0);
    // Scheduled far in the future.
    let mut c = job("fx-scheduled", "report", "gamma");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    c.scheduled_at = Some(prost_types::Timestamp {
        seconds: i64::try_from(now + 3000 * 86_400).unwrap(), // about 8 years on
        nanos: 0,
    });
    let id = enqueue(&mut q, c.clone()).await;
    push(id, &c, "scheduled", 0);
    // Dead-lettered after its only attempt.
    let mut d = job("fx-dead", "charge", "delta");
    d.max_attempts = Some(1);
    let id = enqueue(&mut q, d.clone()).await;
    let got = reserve(&mut q, "fx-dead").await;
    q.nack(pb::NackRequest {
        job_id: got[0].id.clone(),
        attempt: got[0].attempt,
        reason: Some("card declined".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    push(id, &d, "dead_lettered", 1);
    // In flight (its lease will have expired when the fixture is read).
    let e = job("fx-leased", "resize", "epsilon");
    let id = enqueue(&mut q, e.clone()).await;
    reserve(&mut q, "fx-leased").await;
    push(id, &e, "in_flight", 1);
    // Acked, keyed: the job is gone, its dedup record stays.
    let mut f = job("fx-acked", "sync", "zeta");
    f.idempotency_key = Some("key-f".into());
    let id = enqueue(&mut q, f.clone()).await;
    let got = reserve(&mut q, "fx-acked").await;
    q.ack(pb::AckRequest {
        job_id: got[0].id.clone(),
        attempt: got[0].attempt,
        ..Default::default()
    })
    .await
    .unwrap();
    push(id, &f, "acked", 1);
    // A paused queue with a job.
    let g = job("fx-paused", "email", "eta");
    let id = enqueue(&mut q, g.clone()).await;
    push(id, &g, "ready", 0);
    adm.pause_queue(admin::PauseQueueRequest {
        queue: "fx-paused".into(),
    })
    .await
    .unwrap();

    let dir = server.stop().await;
    let data = dir.path().join("data");
    let out = fixture_dir(CURRENT_FORMAT);
    assert!(
        !out.exists(),
        "{} exists: a released format's fixture is never rewritten",
        out.display()
    );
    copy_dir(&data, &out.join("data"));
    trim_journals(&out.join("data"));
    let manifest = Manifest {
        format_version: CURRENT_FORMAT,
        jobs,
        paused_queues: vec!["fx-paused".into()],
    };
    std::fs::write(
        out.join("manifest.toml"),
        toml::to_string(&manifest).unwrap(),
    )
    .unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// fjall preallocates its journal (64 MiB of zeros past the last entry); the committed copy
/// keeps only up to the last non-zero byte, which recovery reads the same way.
fn trim_journals(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jnl") {
            let bytes = std::fs::read(&p).unwrap();
            let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
            std::fs::write(&p, &bytes[..end]).unwrap();
        }
    }
}

fn manifest(format: u32) -> Manifest {
    let path = fixture_dir(format).join("manifest.toml");
    toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A copy of a fixture's data directory (opening it writes), under a fresh test directory.
fn fixture_copy(format: u32) -> common::TempDir {
    let dir = common::TempDir::new();
    copy_dir(&fixture_dir(format).join("data"), &dir.path().join("data"));
    dir
}

#[tokio::test]
async fn a_format_1_directory_opens_and_every_record_reads_back() {
    every_record_reads_back(1).await;
}

#[tokio::test]
async fn a_format_2_directory_opens_and_every_record_reads_back() {
    every_record_reads_back(2).await;
}

#[tokio::test]
async fn a_format_3_directory_opens_and_every_record_reads_back() {
    every_record_reads_back(3).await;
}

/// Opens a copy of fixture `format` in a server of this build and checks every record the
/// manifest lists, bodies included; then acks the ready jobs and enqueues one more (read back),
/// and checks on disk where the bodies are: format 1's in `jobs` under their ids, minus the
/// acked ones, every newer one in `bodies` under its enqueue number, and the directory marked
/// with this build's format. Likewise for dedup records: forgetting a fixture key deletes its
/// record where it is, a new one goes to `dedup_log` under its job's number, and after a
/// restart each key answers as before it.
async fn every_record_reads_back(format: u32) {
    let m = manifest(format);
    assert_eq!(m.format_version, format);
    let server = TestServer::start_in(fixture_copy(format), config).await;
    let mut q = common::Clients::raw(&server).await;
    let mut adm = AdminServiceClient::connect(server.url()).await.unwrap();

    for j in &m.jobs {
        let info = adm
            .get_job(admin::GetJobRequest {
                job_id: j.id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("job {} ({}): {e}", j.id, j.payload))
            .into_inner()
            .job
            .unwrap();
        let state = admin::JobState::try_from(info.state).unwrap();
        let expected: &[admin::JobState] = match j.state.as_str() {
            "ready" => &[admin::JobState::Ready],
            "scheduled" => &[admin::JobState::Scheduled],
            "dead_lettered" => &[admin::JobState::DeadLettered],
            // Its lease ran out while the fixture sat in the repository.
            "in_flight" => &[admin::JobState::InFlight, admin::JobState::Ready],
            "acked" => &[admin::JobState::Completed, admin::JobState::Unknown],
            s => panic!("unknown state {s}"),
        };
        assert!(expected.contains(&state), "{}: {state:?}", j.payload);
        if j.state != "acked" {
            assert_eq!(info.queue, j.queue);
            assert_eq!(info.job_type, j.job_type);
            assert_eq!(info.priority, j.priority);
            assert_eq!(info.max_attempts, j.max_attempts);
            assert_eq!(info.attempt, j.attempt, "{}", j.payload);
            assert_eq!(info.idempotency_key, j.idempotency_key);
            let payload = info.payload.as_ref().map(|p| p.data.as_slice());
            assert_eq!(payload, Some(j.payload.as_bytes()), "{}'s body", j.payload);
        }
        if let Some(key) = &j.idempotency_key {
            let found = adm
                .lookup_idempotency_key(admin::LookupIdempotencyKeyRequest {
                    queue: j.queue.clone(),
                    idempotency_key: key.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(found.found, "dedup record of {key}");
            assert_eq!(found.job_id, j.id);
        }
    }
    for p in &m.paused_queues {
        let stats = adm
            .get_queue_stats(admin::GetQueueStatsRequest { queue: p.clone() })
            .await
            .unwrap()
            .into_inner();
        assert!(stats.paused, "{p} is still paused");
    }
    // Payloads and custom entries read back through Reserve.
    let got = reserve(&mut q, "fx-ready").await;
    let mut payloads: Vec<_> = got
        .iter()
        .map(|j| String::from_utf8(j.payload.clone().unwrap().data).unwrap())
        .collect();
    payloads.sort();
    assert_eq!(payloads, ["alpha", "beta"]);
    let alpha = got
        .iter()
        .find(|j| j.payload.as_ref().unwrap().data == b"alpha")
        .unwrap();
    assert_eq!(
        alpha.custom["tenant"].value,
        Some(pb::primitive_value::Value::StringValue("acme".into()))
    );
    assert_eq!(alpha.payload.as_ref().unwrap().encoding, "text/plain");
    // A keyed enqueue of a fixture key is deduplicated to the fixture's job.
    let mut again = job("fx-acked", "sync", "zeta");
    again.idempotency_key = Some("key-f".into());
    let res = q
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![again] })
        .await
        .unwrap()
        .into_inner();
    let pb::job_result::Outcome::Success(s) = res.results[0].outcome.clone().unwrap() else {
        panic!("rejected");
    };
    assert!(s.deduplicated);
    let f = m.jobs.iter().find(|j| j.payload == "zeta").unwrap();
    assert_eq!(s.job_id, f.id);

    // Acking deletes a body where it is stored; a new job's body goes under its number.
    for j in &got {
        q.ack(pb::AckRequest {
            job_id: j.id.clone(),
            attempt: j.attempt,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // Forgetting a fixture key deletes its record (format 2's in `dedup`, format 3's in
    // `dedup_log`).
    let forgot = adm
        .forget_idempotency_key(admin::ForgetIdempotencyKeyRequest {
            queue: "fx-ready".into(),
            idempotency_key: "key-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(forgot.forgotten, "key-a was forgotten");
    let mut theta = job("fx-new", "email", "theta");
    theta.idempotency_key = Some("key-theta".into());
    let theta = enqueue(&mut q, theta).await;
    let got_theta = reserve(&mut q, "fx-new").await;
    assert_eq!(got_theta.len(), 1);
    assert_eq!(got_theta[0].id, theta);
    assert_eq!(got_theta[0].payload.as_ref().unwrap().data, b"theta");
    let dir = server.stop().await;
    let db = fjall::Database::builder(dir.path().join("data"))
        .open()
        .unwrap();
    let ks = |name: &str| {
        db.keyspace(name, fjall::KeyspaceCreateOptions::default)
            .unwrap()
    };
    let version = ks("info").get("format_version").unwrap().unwrap();
    assert_eq!(
        *version,
        CURRENT_FORMAT.to_le_bytes(),
        "the directory is marked"
    );
    // The keys of a keyspace, the 1-byte sentinel left out; each must be `len` bytes long.
    let keys = |name: &str, len: usize| -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for kv in ks(name).iter() {
            let (k, _) = kv.into_inner().unwrap();
            if k.len() != 1 {
                assert_eq!(k.len(), len, "a key in {name}: {k:?}");
                out.push(k.to_vec());
            }
        }
        out
    };
    let under_ids = keys("jobs", 16);
    let under_numbers = keys("bodies", 8);
    for j in &got {
        let id = uuid::Uuid::parse_str(&j.id).unwrap();
        assert!(
            !under_ids.contains(&id.as_bytes().to_vec()),
            "an acked job's format-1 body is deleted"
        );
    }
    // Bodies left from the fixture: every job not acked before or now.
    let left = m.jobs.iter().filter(|j| j.state != "acked").count() - got.len();
    let (old, new) = if format == 1 {
        (left, 1)
    } else {
        (0, left + 1)
    };
    assert_eq!(under_ids.len(), old, "bodies under job ids");
    assert_eq!(under_numbers.len(), new, "bodies under enqueue numbers");

    // Dedup records: key-f's from the fixture (key-a's is forgotten) and key-theta's.
    let mut by_key = Vec::new();
    for kv in ks("dedup").iter() {
        let (k, _) = kv.into_inner().unwrap();
        if k.len() != 1 {
            by_key.push(String::from_utf8(k.to_vec()).unwrap());
        }
    }
    let logged = keys("dedup_log", 8);
    if format < 3 {
        assert_eq!(
            by_key,
            ["fx-acked\0key-f"],
            "format {format}'s records stay keyed"
        );
        assert_eq!(logged.len(), 1, "key-theta's record under its number");
    } else {
        assert!(by_key.is_empty(), "{by_key:?}");
        assert_eq!(logged.len(), 2, "key-f's and key-theta's records");
    }
    drop(db);

    // After a restart every key answers as it did: forgotten stays forgotten.
    let server = TestServer::start_in(dir, config).await;
    let mut adm = AdminServiceClient::connect(server.url()).await.unwrap();
    let f = &m.jobs.iter().find(|j| j.payload == "zeta").unwrap().id;
    for (queue, key, expected) in [
        ("fx-acked", "key-f", Some(f.as_str())),
        ("fx-ready", "key-a", None),
        ("fx-new", "key-theta", Some(theta.as_str())),
    ] {
        let found = adm
            .lookup_idempotency_key(admin::LookupIdempotencyKeyRequest {
                queue: queue.into(),
                idempotency_key: key.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let got = found.found.then_some(found.job_id.as_str());
        assert_eq!(got, expected, "{key} after a restart");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_newer_format_is_refused_with_the_existing_message() {
    let dir = fixture_copy(1);
    let data = dir.path().join("data");
    {
        let db = fjall::Database::builder(&data).open().unwrap();
        let info = db
            .keyspace("info", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        info.insert("format_version", (CURRENT_FORMAT + 1).to_le_bytes())
            .unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let opts = sepp_server::storage::embedded::EmbeddedOptions {
        path: data,
        persist_mode: sepp_server::config::PersistMode::SyncAll,
        min_free_bytes: 0,
    };
    let e = sepp_server::storage::embedded::EmbeddedStore::open(opts, 0)
        .err()
        .expect("a newer format is refused");
    assert_eq!(
        e.to_string(),
        format!(
            "data directory format version {} is not supported (this sepp reads up to {})",
            CURRENT_FORMAT + 1,
            CURRENT_FORMAT
        )
    );
}
