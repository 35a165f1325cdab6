//! Test harness: an in-process server on 127.0.0.1:0, and the real `sepp` binary for tests
//! where the process itself is under test (kill -9, exit codes).
#![allow(dead_code, unreachable_pub, missing_docs)]

use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_rs::client::SeppClient;
use sepp_server::config::Config;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A server running inside the test process.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server with the default config, changed by `tweak`, on a fresh data directory.
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, tweak).await
    }

    pub async fn start_in(dir: tempfile::TempDir, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        config.server.listen_addr = "127.0.0.1:0".parse().unwrap();
        config.server.db_path = dir.path().join("data");
        config.storage.persist_mode = sepp_server::config::PersistMode::Buffer;
        tweak(&mut config);
        config.validate().expect("test config is valid");
        let listener = sepp_server::bind(&config).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            sepp_server::serve(
                listener,
                config,
                async {
                    let _ = rx.await;
                },
                |_| {},
            )
            .await
            .expect("server ran");
        });
        TestServer {
            addr,
            stop: Some(tx),
            handle: Some(handle),
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> SeppClient {
        SeppClient::connect(self.url()).await.expect("connect")
    }

    pub async fn admin(
        &self,
    ) -> sepp_proto::admin::v1::admin_service_client::AdminServiceClient<Channel> {
        sepp_proto::admin::v1::admin_service_client::AdminServiceClient::connect(self.url())
            .await
            .expect("connect admin")
    }

    pub async fn raw(&self) -> QueueServiceClient<Channel> {
        QueueServiceClient::connect(self.url())
            .await
            .expect("connect raw")
    }

    /// Stops the server gracefully and waits for it; returns the data directory.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(10), h)
                .await
                .expect("server stopped within 10 s")
                .expect("server task");
        }
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The `sepp` binary of this build.
pub fn sepp_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sepp"))
}

/// A `sepp` process started from the real binary.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `sepp --config <dir>/sepp.toml` with `toml` (its listen address forced to port 0)
    /// and waits for the readiness line.
    pub fn start(dir: &Path, toml: &str) -> Self {
        let cfg = dir.join("sepp.toml");
        std::fs::write(&cfg, toml).unwrap();
        let mut child = Command::new(sepp_bin())
            .arg("--config")
            .arg(&cfg)
            .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
            .env("SEPP_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sepp");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read readiness line");
        let addr = line
            .trim()
            .strip_prefix("sepp listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("address");
        ServerProcess { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
