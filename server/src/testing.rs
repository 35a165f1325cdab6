//! Test support: a server running inside the test process, and the real binary as a child
//! process. Used by this crate's tests, the client core's tests and the benchmarks.

pub mod fuzz;
pub mod postgres;
pub mod stalled;

use crate::config::{Config, PersistMode, PostgresUrl, StorageBackend};
use crate::queue::Queue;
use crate::queue::clock::{Clock, ManualClock, SystemClock};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// A fresh directory under the system temp dir, removed when dropped; with the PostgreSQL
/// backend (`SEPP_TEST_BACKEND=postgres`) also the server's database, created at the first
/// start on it and dropped with it, so that a restart on the same directory finds the same data.
#[derive(Debug)]
pub struct TempDir(PathBuf, Arc<tokio::sync::OnceCell<postgres::TestDatabase>>);

impl TempDir {
    /// Creates `sepp-test-<pid>-<n>` under the system temp directory.
    ///
    /// # Panics
    /// When the directory cannot be created.
    pub fn new() -> Self {
        Self::new_in(&std::env::temp_dir())
    }

    /// Creates `sepp-test-<pid>-<n>` under `parent`.
    ///
    /// # Panics
    /// When the directory cannot be created.
    pub fn new_in(parent: &Path) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = parent.join(format!(
            "sepp-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create test directory");
        TempDir(p, Arc::default())
    }

    /// The PostgreSQL database that goes with this directory, created on first use.
    pub async fn database(&self) -> &postgres::TestDatabase {
        self.1.get_or_init(postgres::TestDatabase::create).await
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Opens the store a test server started on `dir` uses (the embedded store in `dir/data`, or
/// with `SEPP_TEST_BACKEND=postgres` the database of `dir`), so that a test can write into it
/// directly, as an older server would have. Close it before starting a server on `dir`.
///
/// # Panics
/// When the store cannot be opened.
pub async fn open_store(dir: &TempDir, now: i64) -> Arc<dyn crate::storage::Store> {
    if postgres::backend_is_postgres() {
        let url = dir.database().await.url().to_string();
        Arc::new(
            crate::storage::postgres::PostgresStore::open(
                crate::storage::postgres::PostgresOptions {
                    url,
                    pool_size: 4,
                    statement_timeout_ms: 30_000,
                    poll_interval_ms: 1000,
                    ca_file: None,
                },
            )
            .await
            .expect("open the PostgreSQL store"),
        )
    } else {
        Arc::new(
            crate::storage::embedded::EmbeddedStore::open(
                crate::storage::embedded::EmbeddedOptions {
                    path: dir.path().join("data"),
                    persist_mode: PersistMode::Buffer,
                    min_free_bytes: 0,
                },
                now,
            )
            .expect("open the embedded store"),
        )
    }
}

/// A server running inside the test process on `127.0.0.1:0`, with `persist_mode = buffer`
/// unless the test says otherwise.
pub struct TestServer {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
    /// The data directory's parent.
    pub dir: TempDir,
    queue: Arc<Queue>,
    clock: Option<Arc<ManualClock>>,
    /// Where `GET /metrics` is served, when the test turned `[metrics] enabled` on.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the admin web UI listens, when the test turned `[admin_ui]` on.
    pub admin_ui_addr: Option<SocketAddr>,
}

impl TestServer {
    /// Starts a server with the default config changed by `tweak`, on a fresh directory.
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_in(TempDir::new(), tweak).await
    }

    /// Starts a server on `dir` (for restarts on the same data).
    ///
    /// # Panics
    /// When the config is invalid, the port cannot be bound or the server does not start.
    pub async fn start_in(dir: TempDir, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::launch(dir, None, tweak).await
    }

    /// Starts a server whose transitions read `clock`: time moves only when the test advances
    /// it. The sweeper still runs on its own, at the manual clock's time; a test that crossed a
    /// deadline runs a pass itself with [`TestServer::sweep`].
    pub async fn start_with_clock(
        clock: Arc<ManualClock>,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        Self::launch(TempDir::new(), Some(clock), tweak).await
    }

    async fn launch(
        dir: TempDir,
        manual: Option<Arc<ManualClock>>,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let mut config = Config::default();
        config.server.listen_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        config.server.db_path = dir.path().join("data");
        config.storage.persist_mode = PersistMode::Buffer;
        tweak(&mut config);
        if postgres::backend_is_postgres() && config.storage.backend == StorageBackend::Embedded {
            config.storage.backend = StorageBackend::Postgres;
            config.storage.postgres_url =
                Some(PostgresUrl::new(dir.database().await.url().to_string()));
            config.storage.postgres_pool_size = 8;
        }
        config.validate().expect("test config is valid");
        crate::queue::limits::Limits::from_config(&config).expect("test limits are valid");
        let listener = crate::bind(&config).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let clock: Arc<dyn Clock> = match &manual {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) =
            oneshot::channel::<(Arc<Queue>, Option<SocketAddr>, Option<SocketAddr>)>();
        let handle = tokio::spawn(async move {
            let stopped = crate::serve_with(
                listener,
                config,
                clock,
                async {
                    let _ = rx.await;
                },
                |r| {
                    let _ = ready_tx.send((r.queue.clone(), r.metrics_addr, r.admin_ui_addr));
                },
            )
            .await
            .expect("server ran");
            // Frees the storage and releases its lock before the task ends, so that a test can
            // restart a server on the same directory once `stop` returns.
            drop(stopped);
        });
        let (queue, metrics_addr, admin_ui_addr) =
            tokio::time::timeout(Duration::from_secs(30), ready_rx)
                .await
                .expect("the server started within 30 s")
                .expect("the server started");
        TestServer {
            addr,
            stop: Some(tx),
            handle: Some(handle),
            dir,
            queue,
            clock: manual,
            metrics_addr,
            admin_ui_addr,
        }
    }

    /// The manual clock of a server started with [`TestServer::start_with_clock`].
    ///
    /// # Panics
    /// When the server reads the system clock.
    pub fn clock(&self) -> &ManualClock {
        self.clock
            .as_deref()
            .expect("a server started with start_with_clock")
    }

    /// Resolves once Reserves wait on at least `n` queues in total (a Reserve listing two
    /// queues counts two), so that a test acts only once its Reserve waits.
    pub async fn reserves_waiting(&self, n: usize) {
        self.queue.ready_signals().waiting(n).await;
    }

    /// Resolves once no Reserve waits any more.
    pub async fn no_reserve_waiting(&self) {
        self.queue.ready_signals().waiting_at_most(0).await;
    }

    /// Runs one sweeper pass now, at the server clock's time.
    ///
    /// # Panics
    /// When the pass fails.
    pub async fn sweep(&self) {
        self.queue.sweep(100_000).await.expect("sweeper pass");
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server gracefully, waits for it and returns its directory.
    ///
    /// # Panics
    /// When the server does not stop within 10 s.
    pub async fn stop(mut self) -> TempDir {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(10), h)
                .await
                .expect("server stopped within 10 s")
                .expect("server task");
        }
        std::mem::take(&mut self.dir)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A `sepp` process started from a binary.
pub struct ServerProcess {
    /// The child.
    pub child: Child,
    /// The address from its readiness line.
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `bin --config <dir>/sepp.toml` with `toml`, its listen address forced to
    /// `127.0.0.1:0`, and waits for the readiness line `sepp listening on ADDR`.
    ///
    /// # Panics
    /// When the process cannot start or prints something else first.
    pub fn start(bin: &Path, dir: &Path, toml: &str) -> Self {
        Self::start_on(bin, dir, toml, "127.0.0.1:0")
    }

    /// As [`ServerProcess::start`], listening on `addr` (to restart a server on the port it
    /// had).
    ///
    /// # Panics
    /// When the process cannot start or prints something else first.
    pub fn start_on(bin: &Path, dir: &Path, toml: &str, addr: &str) -> Self {
        let cfg = dir.join("sepp.toml");
        std::fs::write(&cfg, toml).expect("write config");
        let mut child = Command::new(bin)
            .arg("--config")
            .arg(&cfg)
            .env("SEPP_SERVER__LISTEN_ADDR", addr)
            .env("SEPP_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sepp");
        let stdout = child.stdout.take().expect("stdout");
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

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the process with SIGKILL and reaps it.
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
