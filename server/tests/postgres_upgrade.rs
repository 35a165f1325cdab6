//! A rolling upgrade on PostgreSQL (docs/postgres.md, "Rolling upgrades"): servers of the previous
//! schema version and of this build on one database at once.
//!
//! The previous version is the `sepp` binary of [`OLD_COMMIT`], main's last commit whose
//! migrations stop at V2 (the next commit added `V3__rates.sql`). The test builds it once from
//! this repository's history (`git archive` of that commit, `cargo build --locked`, debug) into
//! `~/.cache/sepp-upgrade/<commit>/sepp` (`SEPP_TEST_UPGRADE_CACHE` moves the cache) and reuses it
//! afterwards; a clone without that commit fails the test, naming it.
//!
//! The scenario: the previous version starts on a fresh database (schema V2) and takes keyed
//! enqueues and leases; this build starts beside it, in-process as `postgres.rs` starts its
//! servers, and migrates the schema to V3 while the previous one keeps serving; both serve at
//! once (a job enqueued on one is reserved and acked on the other, a duplicate key answers the
//! original job on either version, a lease taken on the previous version is acked on this one);
//! the previous version stops, cannot start again on the V3 schema (it exits non-zero saying
//! the schema is newer than it knows), and a second server of this build takes its place.
//! Nothing acknowledged is lost: every job whose enqueue was acknowledged is acked once or is
//! still there at the end, and no acked job comes back.

mod common;

use common::{Clients, TestServer};
use sepp_rs::{EnqueueRequest, Job, ReserveOptions, SeppClient};
use sepp_server::config::{Config, PostgresUrl, StorageBackend};
use sepp_server::testing::postgres::TestDatabase;
use sepp_server::testing::{ServerProcess, TempDir};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The previous version: main's last commit whose PostgreSQL migrations stop at V2 (found with
/// `git log -- server/src/storage/postgres/migrations`: its child `eeb0357` added V3).
const OLD_COMMIT: &str = "8c43ba3511a7bfcb13e1dd2e491144ee3e02e80e";
/// The schema version [`OLD_COMMIT`] creates.
const OLD_SCHEMA: i32 = 2;
/// The schema version of this build.
const NEW_SCHEMA: i32 = 3;

/// Keyed jobs that stay until the end (enqueued on either version).
const KEPT: &str = "kept";
/// Jobs made and settled across versions while both serve.
const MIXED: &str = "mixed";
/// Jobs of the concurrent phase, per producer.
const MIXED_PER_PRODUCER: usize = 100;
/// How long one test step may take before the test fails.
const STEP: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// The previous version's binary

/// The previous version's `sepp`, built on first use and cached.
///
/// # Panics
/// When the commit is not in this clone's history or the build fails.
fn old_sepp() -> PathBuf {
    let cache = std::env::var_os("SEPP_TEST_UPGRADE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME (or SEPP_TEST_UPGRADE_CACHE) is set");
            Path::new(&home).join(".cache/sepp-upgrade")
        });
    let dir = cache.join(OLD_COMMIT);
    let bin = dir.join("sepp");
    std::fs::create_dir_all(&dir).expect("create the upgrade cache");
    // Two checkouts testing at once build it once: the second waits here for the first.
    let lock = std::fs::File::create(dir.join("lock")).expect("create the cache lock");
    lock.lock().expect("lock the upgrade cache");
    if bin.exists() {
        return bin;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).expect("create the source directory");
    let started = Instant::now();
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args(["archive", "--format=tar", OLD_COMMIT])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run git archive");
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&src)
        .stdin(archive.stdout.take().expect("git's stdout"))
        .status()
        .expect("run tar");
    let archived = archive.wait().expect("wait for git archive");
    assert!(
        archived.success() && untar.success(),
        "cannot extract commit {OLD_COMMIT} (the previous schema's sepp) from {}: the test \
         needs the repository's full history (git fetch --unshallow)",
        workspace.display()
    );
    eprintln!("building the previous version's sepp ({OLD_COMMIT}) into {dir:?} once");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--locked", "-p", "sepp-server", "--bin", "sepp"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env("CARGO_INCREMENTAL", "0")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .status()
        .expect("run cargo");
    assert!(built.success(), "building {OLD_COMMIT}'s sepp failed");
    let partial = dir.join("sepp.partial");
    std::fs::copy(dir.join("target/debug/sepp"), &partial).expect("copy the binary");
    std::fs::rename(&partial, &bin).expect("move the binary into place");
    eprintln!(
        "built the previous version's sepp in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // Only the binary is kept (the build directory is about 1 GB).
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(dir.join("target"));
    bin
}

fn old_toml(postgres_url: &str) -> String {
    let escaped = postgres_url.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "[storage]\n\
         backend = \"postgres\"\n\
         postgres_url = \"{escaped}\"\n\
         postgres_poll_interval_ms = 200\n\
         sweep_interval_ms = 100\n"
    )
}

/// Starts the previous version on `db`.
fn start_old(bin: &Path, db: &TestDatabase) -> (ServerProcess, TempDir) {
    let dir = TempDir::new();
    let process = ServerProcess::start(bin, dir.path(), &old_toml(db.url()));
    (process, dir)
}

/// Starts a server of this build on `db`, in-process.
async fn start_new(db: &TestDatabase) -> TestServer {
    let url = db.url().to_string();
    TestServer::start(move |c: &mut Config| {
        c.storage.backend = StorageBackend::Postgres;
        c.storage.postgres_url = Some(PostgresUrl::new(url));
        c.storage.postgres_poll_interval_ms = 200;
        c.storage.sweep_interval_ms = 100;
    })
    .await
}

/// The newest schema version recorded in the database.
async fn schema_version(db: &TestDatabase) -> i32 {
    let (client, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    let conn = tokio::spawn(conn);
    let v: i32 = client
        .query_one("SELECT max(version) FROM sepp_schema_history", &[])
        .await
        .expect("read the schema version")
        .get(0);
    drop(client);
    let _ = conn.await;
    v
}

/// Stops a `sepp` process with SIGTERM and waits for it to exit.
async fn terminate(mut p: ServerProcess) -> std::process::ExitStatus {
    let pid = p.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill")
            .success()
    );
    tokio::time::timeout(
        STEP,
        tokio::task::spawn_blocking(move || p.child.wait().expect("wait for sepp")),
    )
    .await
    .expect("sepp exits after SIGTERM")
    .expect("the waiting thread")
}

// ---------------------------------------------------------------------------------------
// What the clients were told

/// Every acknowledged enqueue and ack, checked as they arrive.
#[derive(Default)]
struct Ledger {
    /// Job id -> its queue, for every acknowledged enqueue that created a job.
    jobs: HashMap<String, &'static str>,
    /// Idempotency key -> the job id its first acknowledged enqueue answered.
    keys: HashMap<String, String>,
    /// Jobs whose ack was acknowledged.
    acked: HashSet<String>,
}

impl Ledger {
    fn enqueued(&mut self, queue: &'static str, key: &str, ack: &sepp_rs::EnqueueAck) {
        match self.keys.get(key) {
            Some(first) => {
                assert!(ack.deduplicated, "a second enqueue of {key} made a new job");
                assert_eq!(&ack.job_id, first, "a duplicate of {key} names another job");
            }
            None => {
                assert!(
                    !ack.deduplicated,
                    "the first enqueue of {key} was a duplicate"
                );
                self.keys.insert(key.to_string(), ack.job_id.clone());
                self.jobs.insert(ack.job_id.clone(), queue);
            }
        }
    }

    fn acked(&mut self, job: &Job) {
        assert!(
            self.jobs.contains_key(&job.id),
            "job {} was never enqueued",
            job.id
        );
        assert!(
            self.acked.insert(job.id.clone()),
            "job {} acked twice",
            job.id
        );
    }

    fn delivered(&self, job: &Job) {
        assert!(
            !self.acked.contains(&job.id),
            "job {} came back after its ack",
            job.id
        );
    }
}

async fn enqueue(
    client: &SeppClient,
    ledger: &Mutex<Ledger>,
    queue: &'static str,
    key: &str,
) -> String {
    let ack = client
        .enqueue(
            EnqueueRequest::new(queue, "t")
                .expect("a valid request")
                .with_idempotency_key(key),
        )
        .await
        .unwrap_or_else(|e| panic!("enqueue {key}: {e}"));
    ledger.lock().expect("ledger").enqueued(queue, key, &ack);
    ack.job_id
}

async fn reserve(client: &SeppClient, queue: &str, max: u32, lease: Duration) -> Vec<Job> {
    client
        .reserve(
            ReserveOptions::new([queue], lease)
                .with_max_jobs(max)
                .with_wait_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_or_else(|e| panic!("reserve on {queue}: {e}"))
}

async fn ack(client: &SeppClient, ledger: &Mutex<Ledger>, job: &Job) {
    client
        .ack(&job.id, job.attempt)
        .await
        .unwrap_or_else(|e| panic!("ack {}: {e}", job.id));
    ledger.lock().expect("ledger").acked(job);
}

/// Reserves on `from` and acks on `to` until `until` jobs of [`MIXED`] are acked in all.
async fn consume(
    from: SeppClient,
    to: SeppClient,
    ledger: Arc<Mutex<Ledger>>,
    acked_mixed: Arc<std::sync::atomic::AtomicUsize>,
    until: usize,
) -> usize {
    use std::sync::atomic::Ordering;
    let mut mine = 0;
    while acked_mixed.load(Ordering::SeqCst) < until {
        for job in reserve(&from, MIXED, 10, Duration::from_secs(60)).await {
            ledger.lock().expect("ledger").delivered(&job);
            ack(&to, &ledger, &job).await;
            acked_mixed.fetch_add(1, Ordering::SeqCst);
            mine += 1;
        }
    }
    mine
}

// ---------------------------------------------------------------------------------------
// The scenario

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_of_the_previous_schema_and_of_this_build_share_a_database_through_an_upgrade() {
    let old_bin = old_sepp();
    let db = TestDatabase::create().await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    // 1. The previous version alone, on a fresh database: it creates the V2 schema, takes
    //    keyed enqueues and grants leases.
    let (old, _old_dir) = start_old(&old_bin, &db);
    assert_eq!(schema_version(&db).await, OLD_SCHEMA);
    let c_old = SeppClient::connect(old.url()).await.expect("connect old");
    for i in 0..20 {
        enqueue(&c_old, &ledger, KEPT, &format!("before-{i}")).await;
    }
    let leased_before = reserve(&c_old, KEPT, 5, Duration::from_secs(60)).await;
    assert_eq!(leased_before.len(), 5, "the old server leased 5 jobs");

    // 2. This build starts beside it and migrates the schema while the old one serves.
    let new_a = start_new(&db).await;
    assert_eq!(schema_version(&db).await, NEW_SCHEMA);
    let c_new = new_a.client().await;

    // Leases granted by the previous version are acked on this one.
    for job in &leased_before {
        ack(&c_new, &ledger, job).await;
    }
    // A duplicate key answers the original job on either version, whichever made it.
    for i in 0..20 {
        enqueue(&c_new, &ledger, KEPT, &format!("before-{i}")).await;
        enqueue(&c_new, &ledger, KEPT, &format!("after-{i}")).await;
        enqueue(&c_old, &ledger, KEPT, &format!("after-{i}")).await;
    }
    // A job enqueued on one version is reserved and acked on the other, both ways.
    let from_old = enqueue(&c_old, &ledger, MIXED, "made-on-old").await;
    let got = reserve(&c_new, MIXED, 10, Duration::from_secs(60)).await;
    assert_eq!(got.iter().map(|j| &j.id).collect::<Vec<_>>(), [&from_old]);
    ack(&c_old, &ledger, &got[0]).await;
    let from_new = enqueue(&c_new, &ledger, MIXED, "made-on-new").await;
    let got = reserve(&c_old, MIXED, 10, Duration::from_secs(60)).await;
    assert_eq!(got.iter().map(|j| &j.id).collect::<Vec<_>>(), [&from_new]);
    ack(&c_new, &ledger, &got[0]).await;
    // A lease the old server grants now and never settles (its holder goes away with it).
    let abandoned = reserve(&c_old, KEPT, 1, Duration::from_secs(1)).await;
    assert_eq!(abandoned.len(), 1);

    // 3. Both at once: a producer on each version, and two consumers, one reserving on the old
    //    and acking on the new, the other the reverse.
    let acked_mixed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let total_mixed = 2 * MIXED_PER_PRODUCER;
    let mut producers = Vec::new();
    for (name, client) in [("old", c_old.clone()), ("new", c_new.clone())] {
        let ledger = ledger.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..MIXED_PER_PRODUCER {
                enqueue(&client, &ledger, MIXED, &format!("mixed-{name}-{i}")).await;
            }
        }));
    }
    let consumers = [
        tokio::spawn(consume(
            c_old.clone(),
            c_new.clone(),
            ledger.clone(),
            acked_mixed.clone(),
            total_mixed,
        )),
        tokio::spawn(consume(
            c_new.clone(),
            c_old.clone(),
            ledger.clone(),
            acked_mixed.clone(),
            total_mixed,
        )),
    ];
    tokio::time::timeout(STEP, async {
        for p in producers {
            p.await.expect("producer");
        }
        let mut by = Vec::new();
        for c in consumers {
            by.push(c.await.expect("consumer"));
        }
        eprintln!(
            "concurrent phase: acked via old->new {}, new->old {}",
            by[0], by[1]
        );
    })
    .await
    .expect("the concurrent phase ends within a minute");
    assert_eq!(
        acked_mixed.load(std::sync::atomic::Ordering::SeqCst),
        total_mixed
    );

    // 4. The previous version stops; it cannot start again on the V3 schema.
    let status = terminate(old).await;
    assert!(status.success(), "the old server exits cleanly: {status}");
    let refused_dir = TempDir::new();
    let cfg = refused_dir.path().join("sepp.toml");
    std::fs::write(&cfg, old_toml(db.url())).expect("write config");
    let mut restart = Command::new(&old_bin);
    restart
        .arg("--config")
        .arg(&cfg)
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_LOG", "warn");
    let out = tokio::time::timeout(
        STEP,
        tokio::task::spawn_blocking(move || restart.output().expect("run the old sepp")),
    )
    .await
    .expect("the old sepp exits at once")
    .expect("the waiting thread");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the old sepp started on the V3 schema: {stdout}"
    );
    assert!(
        stderr.contains("the database schema is version 3, newer than this sepp knows (up to 2)"),
        "{stderr}"
    );
    assert!(!stdout.contains("sepp listening on"), "{stdout}");
    assert_eq!(schema_version(&db).await, NEW_SCHEMA);

    // 5. A second server of this build takes the old one's place. Everything acknowledged is
    //    there: the jobs not acked (the abandoned lease's once it expires) are reserved once
    //    each on the new servers, and no acked job comes back.
    let new_b = start_new(&db).await;
    let c_new_b = new_b.client().await;
    // A key made by the previous version still answers its job on the replacement.
    enqueue(&c_new_b, &ledger, KEPT, "before-0").await;
    enqueue(&c_new_b, &ledger, KEPT, "after-19").await;
    let expected: HashSet<String> = {
        let l = ledger.lock().expect("ledger");
        l.jobs
            .keys()
            .filter(|id| !l.acked.contains(*id))
            .cloned()
            .collect()
    };
    assert_eq!(expected.len(), 35, "40 kept jobs, 5 acked");
    assert!(expected.contains(&abandoned[0].id));
    let mut drained = HashSet::new();
    let deadline = Instant::now() + STEP;
    let clients = [c_new.clone(), c_new_b.clone()];
    let mut turn = 0;
    while drained.len() < expected.len() {
        assert!(
            Instant::now() < deadline,
            "only {} of the {} jobs left came back: missing {:?}",
            drained.len(),
            expected.len(),
            expected.difference(&drained).collect::<Vec<_>>()
        );
        let (from, to) = (&clients[turn % 2], &clients[(turn + 1) % 2]);
        turn += 1;
        for job in reserve(from, KEPT, 50, Duration::from_secs(60)).await {
            ledger.lock().expect("ledger").delivered(&job);
            assert!(drained.insert(job.id.clone()), "{} delivered twice", job.id);
            if job.id == abandoned[0].id {
                assert_eq!(
                    job.attempt, 2,
                    "the abandoned lease's job is its second attempt"
                );
            } else {
                assert_eq!(job.attempt, 1, "{} was delivered before", job.id);
            }
            ack(to, &ledger, &job).await;
        }
    }
    assert_eq!(drained, expected);
    for c in &clients {
        assert!(
            reserve(c, KEPT, 50, Duration::from_secs(60))
                .await
                .is_empty()
        );
        assert!(
            reserve(c, MIXED, 50, Duration::from_secs(60))
                .await
                .is_empty()
        );
    }
    let l = ledger.lock().expect("ledger");
    assert_eq!(l.acked.len(), l.jobs.len(), "every job acked once");
    assert_eq!(l.jobs.len(), 40 + 2 + total_mixed);
}
