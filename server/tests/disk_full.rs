//! Disk full, on a small tmpfs: writes that fail for lack of space get UNAVAILABLE naming the
//! data directory and "no space left", health turns NOT_SERVING, reads show nothing of what was
//! refused, `storage.min_free_bytes` refuses before the disk is full, writes resume on their own
//! once space is freed, and after a restart every acknowledged job and key is there and nothing
//! that was refused is.
//!
//! Needs root (it mounts a tmpfs); without it the test says so and passes.

mod common;

use common::{TempDir, TestServer};
use sepp_proto::admin::v1 as apb;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const MIB: u64 = 1024 * 1024;

/// A tmpfs mounted for the test, unmounted when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size_mib: u64) -> Option<Tmpfs> {
        let uid = std::process::Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            eprintln!("SKIPPED disk_full: not root, cannot mount a tmpfs");
            return None;
        }
        std::fs::create_dir_all(dir).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        if !status.success() {
            eprintln!("SKIPPED disk_full: mount -t tmpfs failed ({status})");
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Still busy (a server that a failed test left running): detach it anyway.
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
}

fn free_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

/// Writes a filler file until the filesystem has at most `leave` bytes free (0: until ENOSPC).
fn fill(path: &Path, leave: u64) {
    let mut f = std::fs::File::create(path).expect("filler");
    let dir = path.parent().unwrap();
    for chunk in [MIB as usize, 4096] {
        let buf = vec![0x5a_u8; chunk];
        loop {
            if leave > 0 && free_bytes(dir) <= leave + chunk as u64 {
                break;
            }
            if f.write_all(&buf).and_then(|()| f.flush()).is_err() {
                break;
            }
        }
    }
}

/// What the producer saw: keys acknowledged (with their job ids) and keys refused.
#[derive(Default)]
struct Seen {
    acked: Vec<(String, String)>,
    refused: Vec<(String, String)>,
}

/// One keyed producer: every attempt uses a new key, so a refused key must never show up.
struct Producer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(url: String, seen: Arc<Mutex<Seen>>, next: Arc<AtomicU64>) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut c = QueueServiceClient::connect(url).await.expect("connect");
            while !flag.load(Ordering::Relaxed) {
                let key = format!("k{}", next.fetch_add(1, Ordering::Relaxed));
                let job = pb::EnqueueRequest {
                    queue: "q".into(),
                    job_type: "t".into(),
                    idempotency_key: Some(key.clone()),
                    payload: Some(pb::Payload {
                        data: vec![7; 512],
                        encoding: "application/octet-stream".into(),
                    }),
                    ..Default::default()
                };
                match c
                    .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![job] })
                    .await
                {
                    Ok(r) => match r.into_inner().results.remove(0).outcome {
                        Some(pb::job_result::Outcome::Success(s)) => {
                            assert!(!s.deduplicated, "{key} is new");
                            seen.lock().unwrap().acked.push((key, s.job_id));
                        }
                        other => panic!("{key} rejected: {other:?}"),
                    },
                    Err(s) => {
                        assert_eq!(s.code(), Code::Unavailable, "{key}: {s:?}");
                        seen.lock()
                            .unwrap()
                            .refused
                            .push((key, s.message().to_string()));
                        // Pacing only: the refusals themselves are what is checked.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        });
        Producer { stop, task }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("producer");
    }
}

async fn wait_for(what: &str, secs: u64, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn health(url: &str) -> (i32, i32) {
    let mut h = HealthClient::new(
        Channel::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut get = async |service: &str| {
        h.check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
    };
    (get("").await, get("sepp.v1.QueueService").await)
}

const SERVING: (i32, i32) = (ServingStatus::Serving as i32, ServingStatus::Serving as i32);
const NOT_SERVING: (i32, i32) = (
    ServingStatus::NotServing as i32,
    ServingStatus::NotServing as i32,
);

/// Reads show exactly the acknowledged jobs and keys: every acked key names its job, no
/// refused key exists, and the queue holds as many jobs as were acknowledged.
async fn check_reads(url: &str, seen: &Mutex<Seen>) {
    let (acked, refused) = {
        let s = seen.lock().unwrap();
        (s.acked.clone(), s.refused.clone())
    };
    let mut admin = AdminServiceClient::connect(url.to_string()).await.unwrap();
    for (key, id) in &acked {
        let r = admin
            .lookup_idempotency_key(apb::LookupIdempotencyKeyRequest {
                queue: "q".into(),
                idempotency_key: key.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.found, "acknowledged key {key} is missing");
        assert_eq!(&r.job_id, id, "acknowledged key {key} names another job");
    }
    for (key, _) in &refused {
        let r = admin
            .lookup_idempotency_key(apb::LookupIdempotencyKeyRequest {
                queue: "q".into(),
                idempotency_key: key.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!r.found, "refused key {key} is visible (job {})", r.job_id);
    }
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.ready, acked.len() as u64, "jobs in the queue");
    assert_eq!(stats.dedup_records, acked.len() as u64, "keys in the queue");
}

fn assert_refusals_name_the_directory(seen: &Mutex<Seen>, data: &Path) {
    let s = seen.lock().unwrap();
    assert!(!s.refused.is_empty());
    for (key, m) in &s.refused {
        assert!(m.contains("no space left"), "{key}: {m}");
        assert!(m.contains(&data.display().to_string()), "{key}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_unavailable_and_recovers_on_its_own() {
    let base = TempDir::new();
    let Some(mnt) = Tmpfs::mount(&base.path().join("mnt"), 64) else {
        return;
    };
    let data = mnt.0.join("data");
    let filler = mnt.0.join("filler");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let next = Arc::new(AtomicU64::new(0));
    let start = |min_free: u64, dir: TempDir| {
        let data = data.clone();
        TestServer::start_in(dir, move |c| {
            c.server.db_path = data;
            c.storage.min_free_bytes = min_free;
        })
    };
    let acked = |seen: &Mutex<Seen>| seen.lock().unwrap().acked.len();

    // 1. The mark off: the disk really fills up and a commit fails with ENOSPC.
    let server = start(0, TempDir::new()).await;
    let url = server.url();
    assert_eq!(health(&url).await, SERVING);
    let p = Producer::start(url.clone(), seen.clone(), next.clone());
    wait_for("100 acks", 30, async || acked(&seen) >= 100).await;
    fill(&filler, 0);
    wait_for("a refusal", 30, async || {
        !seen.lock().unwrap().refused.is_empty()
    })
    .await;
    p.stop().await;
    assert_refusals_name_the_directory(&seen, &data);
    wait_for("NOT_SERVING", 10, async || {
        health(&url).await == NOT_SERVING
    })
    .await;
    check_reads(&url, &seen).await;
    // Free the space: writes resume on their own.
    std::fs::remove_file(&filler).unwrap();
    wait_for("SERVING again", 20, async || health(&url).await == SERVING).await;
    let before = acked(&seen);
    let p = Producer::start(url.clone(), seen.clone(), next.clone());
    wait_for("acks after freeing space", 30, async || {
        acked(&seen) >= before + 100
    })
    .await;
    p.stop().await;
    check_reads(&url, &seen).await;
    let dir = server.stop().await;

    // 2. A restart: everything acknowledged is there, nothing refused.
    let server = start(16 * MIB, dir).await;
    let url = server.url();
    check_reads(&url, &seen).await;
    // 3. The mark on: filling to 6 MiB free (under the 16 MiB mark) refuses before ENOSPC.
    let refused_before = seen.lock().unwrap().refused.len();
    let p = Producer::start(url.clone(), seen.clone(), next.clone());
    wait_for("acks", 30, async || acked(&seen) >= before + 200).await;
    fill(&filler, 6 * MIB);
    wait_for("a refusal at the mark", 30, async || {
        seen.lock().unwrap().refused.len() > refused_before
    })
    .await;
    p.stop().await;
    let free = free_bytes(&mnt.0);
    assert!(
        free >= 2 * MIB,
        "refused with {free} bytes free: before the disk was full"
    );
    assert_refusals_name_the_directory(&seen, &data);
    wait_for("NOT_SERVING at the mark", 10, async || {
        health(&url).await == NOT_SERVING
    })
    .await;
    check_reads(&url, &seen).await;
    std::fs::remove_file(&filler).unwrap();
    wait_for("SERVING above the mark", 20, async || {
        health(&url).await == SERVING
    })
    .await;
    let before = acked(&seen);
    let p = Producer::start(url.clone(), seen.clone(), next.clone());
    wait_for("acks above the mark", 30, async || {
        acked(&seen) >= before + 100
    })
    .await;
    p.stop().await;
    let dir = server.stop().await;

    // 4. A last restart: every acknowledged job and key, nothing refused.
    let server = start(16 * MIB, dir).await;
    check_reads(&server.url(), &seen).await;
    let (acked, refused) = {
        let s = seen.lock().unwrap();
        (s.acked.len(), s.refused.len())
    };
    eprintln!("disk_full: {acked} acknowledged, {refused} refused");
    server.stop().await;
}
