//! Helpers shared by this crate's integration tests, over `sepp_server::testing`.
#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    missing_docs,
    async_fn_in_trait
)]

pub mod pg_cluster;

use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_rs::client::SeppClient;
use std::path::{Path, PathBuf};
use tonic::transport::Channel;

pub use sepp_server::testing::{TempDir, TestServer};

/// The `sepp` binary of this build.
pub fn sepp_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sepp"))
}

/// Runs `cmd` (a `sepp` server on a free port: `SEPP_SERVER__LISTEN_ADDR=127.0.0.1:0`) until it
/// prints its `sepp listening on` line, stops it, and returns what it logged to standard error
/// before that (the warnings of its start), with the line.
#[allow(dead_code)] // not every test binary that includes `common` uses it
pub fn start_up_log(mut cmd: std::process::Command) -> (String, String) {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(line.starts_with("sepp listening on "), "{line:?}");
    (line, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Enqueues a job of type `send` on `queue` and leases it (30 s).
#[allow(dead_code)] // not every test binary that includes `common` uses it
pub async fn enqueue_and_lease(c: &sepp_rs::SeppClient, queue: &str) -> sepp_rs::Job {
    c.enqueue(sepp_rs::EnqueueRequest::new(queue, "send").unwrap())
        .await
        .unwrap();
    c.reserve(sepp_rs::ReserveOptions::new(
        [queue],
        std::time::Duration::from_secs(30),
    ))
    .await
    .unwrap()
    .remove(0)
}

/// Starts this build's binary.
pub struct ServerProcess;

impl ServerProcess {
    pub fn start(dir: &Path, toml: &str) -> sepp_server::testing::ServerProcess {
        sepp_server::testing::ServerProcess::start(&sepp_bin(), dir, toml)
    }
}

pub trait Clients {
    fn url(&self) -> String;
    async fn client(&self) -> SeppClient {
        SeppClient::connect(self.url()).await.expect("connect")
    }
    async fn raw(&self) -> QueueServiceClient<Channel> {
        QueueServiceClient::connect(self.url())
            .await
            .expect("connect raw")
    }
    async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::connect(self.url())
            .await
            .expect("connect admin")
    }
}

impl Clients for TestServer {
    fn url(&self) -> String {
        TestServer::url(self)
    }
}

/// One `GET /metrics` over HTTP/1.1; returns the status line and the body.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head.lines().next().unwrap_or_default().to_string();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    (status, body.to_string())
}

/// The samples of a scrape: `name{labels}` → value.
pub fn samples(body: &str) -> std::collections::BTreeMap<String, String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
