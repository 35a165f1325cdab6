//! Tests of the PostgreSQL backend: the conformance suite, each case on a database of its own
//! (`testing::postgres::TestDatabase`, on the PostgreSQL of `SEPP_TEST_POSTGRES_URL`).

use super::*;
use crate::storage::conformance::Backend;
use crate::testing::postgres::TestDatabase;

/// A fresh database per case; `open` opens a new store on it (the same data after a close).
pub(crate) struct Postgres {
    db: tokio::sync::OnceCell<TestDatabase>,
}

impl Postgres {
    pub(crate) fn new() -> Self {
        Postgres {
            db: tokio::sync::OnceCell::new(),
        }
    }
}

pub(crate) fn options(url: &str) -> PostgresOptions {
    PostgresOptions {
        url: url.to_string(),
        pool_size: 4,
        statement_timeout_ms: 30_000,
        poll_interval_ms: 1000,
        ca_file: None,
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    async fn open(&self, _now: UnixMs) -> Arc<dyn Store> {
        let db = self.db.get_or_init(TestDatabase::create).await;
        Arc::new(
            PostgresStore::open(options(db.url()))
                .await
                .expect("open the PostgreSQL store"),
        )
    }

    /// A PostgreSQL database is backed up with PostgreSQL's tools (docs/postgres.md).
    async fn open_backup(
        &self,
        _dir: &std::path::Path,
        _now: UnixMs,
    ) -> Result<Arc<dyn Store>, &'static [&'static str]> {
        Err(&["pg_dump", "pg_basebackup"])
    }
}

crate::storage::conformance::conformance_suite!(Postgres::new());
crate::storage::model::model_test!(Postgres::new());
