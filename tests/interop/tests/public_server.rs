//! Our client core against the public sepp server (`sepp` 0.1.1 from crates.io, run as a black
//! box). `make test-interop` installs it and sets `PUBLIC_SEPP_BIN`; without it this suite
//! fails rather than skips.

use sepp_rs::{EnqueueRequest, NackRetry, ReserveOptions, SeppClient};
use sepp_server::testing::TempDir;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The public server as a child process. It prints no readiness line, so it gets a port
/// chosen here and is ready once that port accepts connections.
struct PublicServer {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
}

impl PublicServer {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for PublicServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn public_server() -> PublicServer {
    let bin = std::env::var_os("PUBLIC_SEPP_BIN")
        .map(PathBuf::from)
        .expect("PUBLIC_SEPP_BIN must name the public sepp binary (run `make test-interop`)");
    let dir = TempDir::new();
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let toml = format!(
        // Its admin UI would bind a fixed port: off, so that tests can run side by side.
        "[server]\nlisten_addr = \"{addr}\"\ndb_path = \"{}\"\n[storage]\ndead_letter_retention_ms = 60000\n[admin]\nenabled = false\n",
        dir.path().join("data").display()
    );
    let cfg = dir.path().join("sepp.toml");
    std::fs::write(&cfg, toml).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the public sepp");
    let server = PublicServer {
        child,
        addr,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the public server did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

#[tokio::test]
async fn our_client_deduplicates_against_the_public_server() {
    let server = public_server();
    let client = SeppClient::connect(server.url()).await.unwrap();
    let info = client.get_server_info().await.unwrap();
    assert_eq!(info.supported_protocol_versions, vec!["v1"]);
    let req = EnqueueRequest::new("emails", "receipt")
        .unwrap()
        .with_payload(b"{}".to_vec(), "application/json")
        .with_idempotency_key("interop-1");
    let first = client.enqueue(req.clone()).await.unwrap();
    let second = client.enqueue(req).await.unwrap();
    assert!(!first.deduplicated && second.deduplicated);
    assert_eq!(first.job_id, second.job_id);
    // The client-side key check uses the limit the public server advertises.
    let long = EnqueueRequest::new("emails", "receipt")
        .unwrap()
        .with_idempotency_key("k".repeat(info.max_idempotency_key_bytes as usize + 1));
    assert!(client.enqueue(long).await.is_err());
}

#[tokio::test]
async fn our_client_reserves_acks_nacks_and_drains_on_the_public_server() {
    let server = public_server();
    let c = SeppClient::connect(server.url()).await.unwrap();
    for i in 0..3 {
        c.enqueue(
            EnqueueRequest::new("work", "t")
                .unwrap()
                .with_priority(i)
                .with_max_attempts(2),
        )
        .await
        .unwrap();
    }
    let jobs = c
        .reserve(ReserveOptions::new(["work"], Duration::from_secs(30)).with_max_jobs(3))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].priority, 2, "highest priority first");
    c.ack(&jobs[0].id, jobs[0].attempt).await.unwrap();
    assert!(
        c.ack(&jobs[0].id, jobs[0].attempt)
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    c.extend(&jobs[1].id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        !c.nack(&jobs[1].id, 1, NackRetry::Default, None)
            .await
            .unwrap()
    );
    assert!(
        c.nack(&jobs[2].id, 1, NackRetry::DeadLetter, Some("bad".into()))
            .await
            .unwrap()
    );
    let dead = c.drain_dead_letters(Some("work"), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_reason.as_deref(), Some("bad"));
    let again = c
        .reserve(
            ReserveOptions::new(["work"], Duration::from_secs(30))
                .with_wait_timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
}

#[tokio::test]
async fn ack_then_reserve_on_the_public_server_acks_and_leaves_the_next_job_to_reserve() {
    let server = public_server();
    let c = SeppClient::connect(server.url()).await.unwrap();
    for _ in 0..2 {
        c.enqueue(EnqueueRequest::new("work", "t").unwrap())
            .await
            .unwrap();
    }
    let lease = Duration::from_secs(30);
    let first = c
        .reserve(ReserveOptions::new(["work"], lease))
        .await
        .unwrap()
        .remove(0);
    // The public server does not know the extension: it acks and leases nothing for it.
    let next = c
        .ack_then_reserve(
            &first.id,
            first.attempt,
            ReserveOptions::new(["work"], lease),
        )
        .await
        .unwrap();
    assert!(next.is_none(), "the public server leased {next:?}");
    assert!(
        c.ack(&first.id, first.attempt)
            .await
            .unwrap_err()
            .is_lease_lost()
    );
    let second = c
        .reserve(ReserveOptions::new(["work"], lease))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "the second job is still ready");
    assert_eq!(second[0].attempt, 1);
}
