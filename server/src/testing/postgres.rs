//! A fresh PostgreSQL database per test, dropped at the end: tests run in parallel, each on
//! its own database of the server named by `SEPP_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`, the one that runs on the CI machine). Names
//! are `<prefix>_<pid>_<n>_<random>`, the prefix from `SEPP_TEST_DB_PREFIX` (default
//! `sepp_test`), so that several checkouts can share one PostgreSQL.

use std::sync::atomic::{AtomicU64, Ordering};

/// The server the test databases are created on.
pub fn admin_url() -> String {
    std::env::var("SEPP_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// Which backend the test server rig uses: `SEPP_TEST_BACKEND=postgres` runs the end-to-end
/// suites against PostgreSQL (a fresh database per server), anything else against the
/// embedded backend.
pub fn backend_is_postgres() -> bool {
    std::env::var("SEPP_TEST_BACKEND").is_ok_and(|v| v == "postgres")
}

/// A database created for one test and dropped (with every connection to it) when this is
/// dropped.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
}

async fn admin() -> tokio_postgres::Client {
    let url = admin_url();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test PostgreSQL (SEPP_TEST_POSTGRES_URL, default \
                 postgres://postgres@127.0.0.1:5432/postgres): {e}"
            )
        });
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

impl TestDatabase {
    /// Creates an empty database.
    ///
    /// # Panics
    /// When the test PostgreSQL cannot be reached or the database cannot be created.
    pub async fn create() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let prefix = std::env::var("SEPP_TEST_DB_PREFIX").unwrap_or_else(|_| "sepp_test".into());
        let name = format!(
            "{prefix}_{}_{}_{:08x}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            uuid::Uuid::new_v4().as_u128() as u32
        );
        let client = admin().await;
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let mut cfg: tokio_postgres::Config = admin_url().parse().expect("admin url parses");
        cfg.dbname(&name);
        let url = url_of(&cfg);
        TestDatabase { name, url }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection string for it.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// A key=value connection string from a parsed config (TCP hosts only).
fn url_of(cfg: &tokio_postgres::Config) -> String {
    let mut parts = Vec::new();
    let hosts: Vec<String> = cfg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        parts.push(format!("host={}", hosts.join(",")));
    }
    let ports: Vec<String> = cfg.get_ports().iter().map(u16::to_string).collect();
    if !ports.is_empty() {
        parts.push(format!("port={}", ports.join(",")));
    }
    if let Some(u) = cfg.get_user() {
        parts.push(format!("user={u}"));
    }
    if let Some(p) = cfg.get_password() {
        parts.push(format!(
            "password='{}'",
            String::from_utf8_lossy(p)
                .replace('\\', "\\\\")
                .replace('\'', "\\'")
        ));
    }
    if let Some(d) = cfg.get_dbname() {
        parts.push(format!("dbname={d}"));
    }
    parts.join(" ")
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside a test's runtime: do the async work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let client = admin().await;
                if let Err(e) = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
                {
                    eprintln!("DROP DATABASE {name}: {e}");
                }
            });
        })
        .join();
    }
}
