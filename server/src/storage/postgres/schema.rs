//! Connecting to PostgreSQL and bringing its schema up to date.
//!
//! Migrations are refinery's, embedded from `migrations/` (`V<n>__<name>.sql`, forward only),
//! applied at start under a session advisory lock ([`MIGRATION_LOCK`]) so that servers starting
//! together apply each one once. A database whose schema is newer than this build (a
//! migration this build does not know) is refused: an older sepp must not write into a schema
//! it does not understand.

use crate::storage::StorageError;

mod embedded {
    refinery::embed_migrations!("src/storage/postgres/migrations");
}

/// refinery's history table, named for sepp.
pub(crate) const HISTORY_TABLE: &str = "sepp_schema_history";

/// The advisory lock key under which migrations run (an arbitrary constant: "sepp" + 1).
pub(crate) const MIGRATION_LOCK: i64 = 0x7365_7070_0000_0001;

/// The newest schema version this build knows.
pub(crate) fn latest_version() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(refinery::Migration::version)
        .max()
        .unwrap_or(0)
}

/// Where a connection goes, for error messages: host(s), port(s), database and user, never the
/// password.
pub(crate) fn describe(cfg: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = cfg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = cfg.get_ports().iter().map(u16::to_string).collect();
    let hosts = if hosts.is_empty() {
        "localhost".to_string()
    } else {
        hosts.join(",")
    };
    let ports = if ports.is_empty() {
        "5432".to_string()
    } else {
        ports.join(",")
    };
    let user = cfg.get_user().unwrap_or("(none)");
    let db = cfg.get_dbname().unwrap_or(user);
    format!("host {hosts}, port {ports}, database {db}, user {user}")
}

/// The whole message of a driver error, one line (the driver's top-level message and its
/// cause).
pub(crate) fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut s = e.to_string();
    if let Some(src) = std::error::Error::source(e) {
        let src = src.to_string();
        if !s.contains(&src) {
            s.push_str(": ");
            s.push_str(&src);
        }
    }
    s.replace('\n', " ")
}

/// Connects once (for the migrations) and applies every migration this build has that the
/// database lacks, under [`MIGRATION_LOCK`].
///
/// # Errors
/// [`StorageError::Unavailable`] naming host, port, database and user when the database cannot
/// be reached or refuses the login; [`StorageError::Io`] when its schema is newer than this
/// build or a migration fails.
pub(crate) async fn migrate(
    cfg: &tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
) -> Result<(), StorageError> {
    let (mut client, conn) = cfg.connect(tls).await.map_err(|e| {
        StorageError::Unavailable(format!(
            "cannot connect to PostgreSQL ({}): {}",
            describe(cfg),
            error_text(&e)
        ))
    })?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let result = migrate_on(&mut client, cfg).await;
    drop(client);
    let _ = conn.await;
    result
}

async fn migrate_on(
    client: &mut tokio_postgres::Client,
    cfg: &tokio_postgres::Config,
) -> Result<(), StorageError> {
    let io = |what: &str, e: tokio_postgres::Error| {
        StorageError::Io(format!(
            "PostgreSQL ({}): {what}: {}",
            describe(cfg),
            error_text(&e)
        ))
    };
    client
        .query_one("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| io("cannot take the migration lock", e))?;
    let result = async {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE])
            .await
            .map_err(|e| io("cannot read the schema version", e))?
            .get(0);
        let newest: Option<i32> = if exists {
            client
                .query_one(&format!("SELECT max(version) FROM {HISTORY_TABLE}"), &[])
                .await
                .map_err(|e| io("cannot read the schema version", e))?
                .get(0)
        } else {
            None
        };
        let latest = latest_version();
        if let Some(found) = newest
            && found > latest
        {
            return Err(StorageError::Io(format!(
                "PostgreSQL ({}): the database schema is version {found}, newer than this sepp \
                 knows (up to {latest}): run a newer sepp",
                describe(cfg)
            )));
        }
        let mut runner = embedded::migrations::runner()
            .set_abort_divergent(true)
            .set_abort_missing(true);
        runner.set_migration_table_name(HISTORY_TABLE);
        let report = runner.run_async(client).await.map_err(|e| {
            StorageError::Io(format!(
                "PostgreSQL ({}): migration failed: {e}",
                describe(cfg)
            ))
        })?;
        for m in report.applied_migrations() {
            tracing::info!(
                version = m.version(),
                name = m.name(),
                "schema migration applied"
            );
        }
        Ok(())
    }
    .await;
    let _ = client
        .query_one("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    result
}
