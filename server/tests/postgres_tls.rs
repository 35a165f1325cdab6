//! TLS from sepp to PostgreSQL, against private clusters (`ssl = on` with a certificate made
//! here by rcgen, or `ssl = off`): `sslmode=verify-full` with the right CA works end to end and
//! every sepp connection is encrypted (`pg_stat_ssl`); a wrong CA, or `sslmode=require` against
//! a server without TLS, stops sepp at start with one line naming the database, never the
//! password. Skipped (with a SKIPPED line) where initdb is missing.

mod common;

use common::pg_cluster::{Cluster, cannot_run_clusters, pg_bin};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use sepp_server::testing::TempDir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PASSWORD: &str = "pw-never-printed";

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
}

/// A cluster with `ssl = on` and a server certificate for 127.0.0.1 signed by `ca`.
fn tls_cluster(bin: &Path, ca: &CertifiedIssuer<'static, KeyPair>) -> Cluster {
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("params");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, ca).expect("server certificate");
    Cluster::primary_with(bin, |c| {
        c.write_file("server.crt", cert.pem().as_bytes());
        c.write_file("server.key", key.serialize_pem().as_bytes());
        c.configure("ssl = on");
    })
}

fn url(c: &Cluster, sslmode: &str) -> String {
    format!(
        "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres?sslmode={sslmode}",
        c.port
    )
}

fn config(url: &str, ca_file: Option<&Path>) -> String {
    let mut toml = format!(
        "[storage]\nbackend = \"postgres\"\npostgres_url = \"{url}\"\n\
         postgres_pool_size = 4\n"
    );
    if let Some(p) = ca_file {
        toml.push_str(&format!("postgres_ca_file = \"{}\"\n", p.display()));
    }
    toml
}

fn write_ca(dir: &TempDir, ca: &CertifiedIssuer<'static, KeyPair>) -> PathBuf {
    let p = dir.path().join("pg-ca.pem");
    std::fs::write(&p, ca.pem()).expect("write CA");
    p
}

/// Runs sepp with `toml`, expecting it to stop at start: its exit code and stderr.
fn refused(dir: &TempDir, toml: &str) -> (Option<i32>, String) {
    let cfg = dir.path().join("sepp.toml");
    std::fs::write(&cfg, toml).expect("write config");
    let out = Command::new(common::sepp_bin())
        .arg("--config")
        .arg(&cfg)
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_LOG", "error")
        .output()
        .expect("run sepp");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("sepp listening on"),
        "sepp started: {stdout}"
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn skip(test: &str) -> bool {
    if let Some(why) = cannot_run_clusters() {
        eprintln!("SKIPPED {test}: {why}");
        return true;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_right_ca_enqueues_reserves_and_every_connection_is_encrypted() {
    if skip("verify_full_with_the_right_ca_enqueues_reserves_and_every_connection_is_encrypted") {
        return;
    }
    let ca = ca("sepp test PostgreSQL CA");
    let pg = tls_cluster(&pg_bin().expect("bin"), &ca);
    let dir = TempDir::new();
    let ca_file = write_ca(&dir, &ca);
    let sepp = common::ServerProcess::start(
        dir.path(),
        &config(&url(&pg, "verify-full"), Some(&ca_file)),
    );
    let client = SeppClient::connect(sepp.url()).await.expect("connect");
    let ack = client
        .enqueue(EnqueueRequest::new("tls", "payload").expect("request"))
        .await
        .expect("enqueue");
    let jobs = client
        .reserve(
            ReserveOptions::new(["tls"], Duration::from_secs(30))
                .with_wait_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("reserve");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, ack.job_id);
    client.ack(&jobs[0].id, jobs[0].attempt).await.expect("ack");

    // Every connection sepp holds (the pool's and the LISTEN connection) is TLS. The LISTEN
    // connection is opened by a task of its own, which may still be connecting when the calls
    // above are answered: wait (10 s at most) until PostgreSQL shows it, encrypted or not.
    let admin = pg.connect("postgres").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (tls, plain, listen) = loop {
        let row = admin
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl), \
                        count(*) FILTER (WHERE a.query ILIKE 'LISTEN%' AND s.ssl), \
                        count(*) FILTER (WHERE a.query ILIKE 'LISTEN%') \
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = 'sepp'",
                &[],
            )
            .await
            .expect("pg_stat_ssl");
        let (tls, plain, listen, listening): (i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if listening > 0 || std::time::Instant::now() > deadline {
            break (tls, plain, listen);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("sepp connections: {tls} over TLS ({listen} of them LISTEN), {plain} plain");
    assert!(
        tls >= 2,
        "sepp holds {tls} TLS connections, expected the pool's and LISTEN's"
    );
    assert_eq!(plain, 0, "sepp holds {plain} unencrypted connections");
    assert_eq!(listen, 1, "the LISTEN connection is not over TLS");
}

#[test]
fn a_wrong_ca_stops_sepp_at_start_naming_the_database() {
    if skip("a_wrong_ca_stops_sepp_at_start_naming_the_database") {
        return;
    }
    let right = ca("the cluster's CA");
    let wrong = ca("another CA");
    let pg = tls_cluster(&pg_bin().expect("bin"), &right);
    let dir = TempDir::new();
    let ca_file = write_ca(&dir, &wrong);
    let (code, err) = refused(&dir, &config(&url(&pg, "verify-full"), Some(&ca_file)));
    eprintln!("{err}");
    assert_ne!(code, Some(0), "{err}");
    let place = format!(
        "cannot connect to PostgreSQL (host 127.0.0.1, port {}, database postgres, user postgres)",
        pg.port
    );
    assert!(err.contains(&place), "{err}");
    assert!(err.contains("TLS") && err.contains("certificate"), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn require_against_a_server_without_tls_stops_sepp_at_start() {
    if skip("require_against_a_server_without_tls_stops_sepp_at_start") {
        return;
    }
    let pg = Cluster::primary(&pg_bin().expect("bin"));
    let dir = TempDir::new();
    let (code, err) = refused(&dir, &config(&url(&pg, "require"), None));
    eprintln!("{err}");
    assert_ne!(code, Some(0), "{err}");
    let place = format!(
        "cannot connect to PostgreSQL (host 127.0.0.1, port {}, database postgres, user postgres)",
        pg.port
    );
    assert!(err.contains(&place), "{err}");
    assert!(err.contains("TLS"), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");
}
