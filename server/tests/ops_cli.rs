//! The operator CLI (`sepp queues`, `sepp jobs`, `sepp job`, `sepp key`, `sepp cancel`,
//! `sepp dlq ...`, `sepp pause|resume`, `sepp purge`): the real binary against a real server
//! process with API keys on.

mod common;

use common::{ServerProcess, sepp_bin};
use sepp_rs::{EnqueueRequest, NackRetry, ReserveOptions, SeppClient};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const KEY: &str = "h16a-secret";

struct Cli {
    url: String,
}

impl Cli {
    /// Runs `sepp ARGS` against the server; (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(sepp_bin())
            .args(args)
            .env("SEPP_SERVER", &self.url)
            .env("SEPP_API_KEY", KEY)
            .env_remove("SEPP_CONFIG")
            .output()
            .expect("run sepp");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "sepp {args:?}: {err}");
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["--output", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("json output")
    }
}

#[tokio::test]
async fn every_operator_subcommand_against_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[auth]\napi_keys = [{{ name = \"ops\", key = \"{KEY}\" }}]\n\
         [storage]\ndead_letter_retention_ms = 600000\n",
        dir.path().join("data").display()
    );
    let server = ServerProcess::start(dir.path(), &toml);
    let cli = Cli { url: server.url() };
    let c = SeppClient::builder(server.url())
        .api_key(KEY)
        .connect()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = EnqueueRequest::new("mail", "send")
            .unwrap()
            .with_idempotency_key(format!("order-{i}"));
        ids.push(c.enqueue(r).await.unwrap().job_id);
    }
    // One dead letter: reserved, then rejected.
    let j = c
        .reserve(ReserveOptions::new(["mail"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.nack(
        &j.id,
        j.attempt,
        NackRetry::DeadLetter,
        Some("bad address".into()),
    )
    .await
    .unwrap();
    let dead = j.id.clone();

    // Without the key: refused, and told what to do.
    let out = Command::new(sepp_bin())
        .args(["queues"])
        .env("SEPP_SERVER", server.url())
        .env_remove("SEPP_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthenticated") && err.contains("--api-key"),
        "{err}"
    );

    // queues: a table and JSON.
    let table = cli.ok(&["queues"]);
    assert!(table.starts_with("QUEUE"), "{table}");
    let row = table.lines().find(|l| l.starts_with("mail")).unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["mail", "2", "0", "0", "1", "3"]
    );
    let q = cli.json(&["queues"]);
    assert_eq!(q["queues"][0]["queue"], "mail");
    assert_eq!(q["queues"][0]["ready"], 2);
    assert_eq!(q["queues"][0]["dead_lettered"], 1);

    // jobs: paged.
    let p1 = cli.json(&["jobs", "mail", "--limit", "1"]);
    assert_eq!(p1["jobs"].as_array().unwrap().len(), 1);
    let token = p1["next_page_token"].as_str().unwrap().to_string();
    assert!(!token.is_empty());
    let p2 = cli.json(&["jobs", "mail", "--limit", "1", "--page-token", &token]);
    assert_ne!(p2["jobs"][0]["job_id"], p1["jobs"][0]["job_id"]);
    let dead_jobs = cli.json(&["jobs", "mail", "--state", "dead"]);
    assert_eq!(dead_jobs["jobs"][0]["job_id"], dead.as_str());
    assert!(cli.ok(&["jobs", "mail"]).contains(&ids[1]));

    // job and key.
    let info = cli.json(&["job", &dead]);
    assert_eq!(info["state"], "dead_lettered");
    assert_eq!(info["dead_letter_cause"], "rejected");
    assert_eq!(info["last_reason"], "bad address");
    assert!(cli.ok(&["job", &dead]).contains("bad address"));
    let (code, _, err) = cli.run(&["job", "00000000-0000-4000-8000-000000000000"]);
    assert_eq!(code, 1);
    assert!(err.contains("not known"), "{err}");
    let k = cli.json(&["key", "mail", "order-1"]);
    assert_eq!(k["job_id"], ids[1].as_str());
    assert_eq!(k["job"]["state"], "ready");
    let (code, _, err) = cli.run(&["key", "mail", "never-used"]);
    assert_eq!(code, 1);
    assert!(err.contains("no live dedup record"), "{err}");

    // dlq list, requeue by id; then the job is ready again.
    let l = cli.json(&["dlq", "list", "mail"]);
    assert_eq!(l["records"][0]["job_id"], dead.as_str());
    assert_eq!(l["records"][0]["cause"], "rejected");
    assert!(cli.ok(&["dlq", "list"]).contains("bad address"));
    let r = cli.json(&["dlq", "requeue", "mail", &dead]);
    assert_eq!(r["requeued"][0], dead.as_str());
    assert_eq!(cli.json(&["job", &dead])["state"], "ready");
    // Requeueing it again: not a dead letter any more, said so, exit 1.
    let (code, _, err) = cli.run(&["dlq", "requeue", "mail", &dead]);
    assert_eq!(code, 1);
    assert!(err.contains("not dead letters"), "{err}");

    // Dead-letter two, then delete --all.
    for _ in 0..2 {
        let j = c
            .reserve(ReserveOptions::new(["mail"], Duration::from_secs(30)))
            .await
            .unwrap()
            .remove(0);
        c.nack(&j.id, j.attempt, NackRetry::DeadLetter, None)
            .await
            .unwrap();
    }
    let d = cli.json(&["dlq", "delete", "mail", "--all"]);
    assert_eq!(d["deleted"].as_array().unwrap().len(), 2);
    assert_eq!(cli.json(&["queues"])["queues"][0]["dead_lettered"], 0);

    // pause / resume.
    assert!(cli.ok(&["pause", "mail"]).contains("paused mail"));
    assert_eq!(cli.json(&["queues"])["queues"][0]["paused"], true);
    cli.ok(&["resume", "mail"]);
    assert_eq!(cli.json(&["queues"])["queues"][0]["paused"], false);

    // cancel by key: the key still answers the cancelled job's id.
    let ready = cli.json(&["jobs", "mail"]);
    let left = ready["jobs"].as_array().unwrap().clone();
    assert_eq!(left.len(), 1);
    let left_id = left[0]["job_id"].as_str().unwrap().to_string();
    let left_key = left[0]["idempotency_key"].as_str().unwrap().to_string();
    let cancelled = cli.json(&["cancel", "--queue", "mail", "--key", &left_key]);
    assert_eq!(cancelled["job"]["job_id"], left_id.as_str());
    assert_eq!(cancelled["job"]["last_reason"], "cancelled by an operator");
    let again = c
        .enqueue(
            EnqueueRequest::new("mail", "send")
                .unwrap()
                .with_idempotency_key(left_key.clone()),
        )
        .await
        .unwrap();
    assert_eq!(again.job_id, left_id);
    let (code, _, err) = cli.run(&["cancel", &left_id]);
    assert_eq!(code, 1);
    assert!(err.contains("only ready or scheduled"), "{err}");

    // purge: needs --yes; then empties ready and scheduled jobs.
    for _ in 0..5 {
        c.enqueue(EnqueueRequest::new("bulk", "t").unwrap())
            .await
            .unwrap();
    }
    let (code, _, err) = cli.run(&["purge", "bulk"]);
    assert_eq!(code, 1);
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(cli.json(&["purge", "bulk", "--yes"])["purged"], 5);
    let qs = cli.json(&["queues"]);
    let bulk = qs["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "bulk")
        .unwrap()
        .clone();
    assert_eq!(bulk["ready"], 0);

    // A server that is not there: named, with what to check.
    let out = Command::new(sepp_bin())
        .args(["queues", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the server running"));
}
