//! The operator CLI (`sepp queues`, `sepp jobs`, `sepp job`, `sepp key`, `sepp cancel`,
//! `sepp dlq ...`, `sepp pause|resume`, `sepp purge`, `sepp queue delete`): the real binary against a real server
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
    assert!(
        table.lines().next().unwrap().split_whitespace().eq([
            "QUEUE",
            "READY",
            "SCHEDULED",
            "IN_FLIGHT",
            "DEAD",
            "KEYS",
            "ENQ/MIN",
            "ACK/MIN",
            "NACK/MIN",
            "DLQ/MIN",
            "PAUSED"
        ]),
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("mail")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    // The rates are the last complete minute's (their values are checked with a manual clock
    // in tests/queues.rs): here only that they are numbers.
    assert_eq!(cells[..6], ["mail", "2", "0", "0", "1", "3"], "{row}");
    assert_eq!(cells.len(), 11, "{row}");
    assert!(
        cells[6..10].iter().all(|c| c.parse::<u64>().is_ok()),
        "{row}"
    );
    assert_eq!(cells[10], "no", "{row}");
    let q = cli.json(&["queues"]);
    assert_eq!(q["queues"][0]["queue"], "mail");
    for k in ["enqueued", "acked", "nacked", "dead_lettered"] {
        assert!(q["queues"][0]["per_minute"][k].is_u64(), "{q}");
    }
    assert_eq!(q["queues"][0]["ready"], 2);
    assert_eq!(q["queues"][0]["dead_lettered"], 1);

    // jobs: paged.
    let p1 = cli.json(&["jobs", "mail", "--limit", "1"]);
    assert_eq!(p1["jobs"].as_array().unwrap().len(), 1);
    let token = p1["next_page_token"].as_str().unwrap().to_string();
    assert!(!token.is_empty());
    let p2 = cli.json(&["jobs", "mail", "--limit", "1", "--page-token", &token]);
    assert_ne!(p2["jobs"][0]["job_id"], p1["jobs"][0]["job_id"]);
    // An empty table says whether the queue exists, and where to look for those that do.
    let (code, out, err) = cli.run(&["jobs", "no-such-queue"]);
    assert_eq!(code, 0);
    assert!(out.contains("JOB_ID"), "{out}");
    assert!(
        err.contains(
            "queue \"no-such-queue\" does not exist (no job, pause or [[queues]] entry has \
             made it); `sepp queues` lists the queues that do"
        ),
        "{err}"
    );
    let (code, _, err) = cli.run(&["jobs", "mail", "--state", "scheduled"]);
    assert_eq!(code, 0);
    assert_eq!(err.trim(), "no scheduled jobs in queue \"mail\"");
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
    let (code, _, err) = cli.run(&["job", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("\"nope\" is not a job id: job ids are UUIDs"),
        "{err}"
    );
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
    assert!(
        err.contains("1 of the ids given is not a dead letter (already requeued"),
        "{err}"
    );
    // Neither ids nor --all: refused, naming both ways and the queue.
    for verb in ["requeue", "delete"] {
        let (code, _, err) = cli.run(&["dlq", verb, "mail"]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("sepp dlq {verb} mail ID...")) && err.contains("--all"),
            "{err}"
        );
        // An id alone was read as the queue: said so, with the order of the two.
        let (code, _, err) = cli.run(&["dlq", verb, &dead]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!(
                "{dead} looks like a job id, not a queue: the queue comes first (sepp dlq {verb} QUEUE {dead})"
            )),
            "{err}"
        );
    }

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
    assert_eq!(cli.ok(&["pause", "mail"]).trim(), "paused mail");
    // A pause of a queue that does not exist creates it, and says so.
    assert_eq!(
        cli.ok(&["pause", "mial"]).trim(),
        "paused mial, a new queue: it did not exist (`sepp queues` lists those that did; \
         `sepp queue delete mial` undoes it)"
    );
    assert_eq!(
        cli.json(&["pause", "mial"]),
        serde_json::json!({"queue": "mial", "paused": true, "created": false})
    );
    assert!(
        cli.ok(&["queue", "delete", "mial"])
            .contains("deleted queue mial")
    );
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

    // `sepp queue delete`: refused while the queue holds a job (naming the counts), then the
    // emptied queue is deleted and no longer listed.
    c.enqueue(EnqueueRequest::new("busy", "t").unwrap())
        .await
        .unwrap();
    let (code, _, err) = cli.run(&["queue", "delete", "busy"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("FailedPrecondition") && err.contains("holds 1 ready"),
        "{err}"
    );
    let del = cli.json(&["queue", "delete", "bulk"]);
    assert_eq!(del["deleted"], true);
    assert_eq!(del["dedup_records"], 0);
    assert_eq!(del["was_paused"], false);
    let qs = cli.json(&["queues"]);
    assert!(
        qs["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["queue"] != "bulk"),
        "{qs}"
    );
    let (code, _, err) = cli.run(&["queue", "delete", "bulk"]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    let j = common::enqueue_and_lease(&c, "gone").await;
    c.ack(&j.id, j.attempt).await.unwrap();
    assert_eq!(
        cli.ok(&["queue", "delete", "gone"]).trim(),
        "deleted queue gone"
    );

    // job: what the job carries. The table shows the payload's encoding and its text cut to
    // one line with its full size; JSON has the whole payload in base64; a listing leaves it
    // out.
    let body = format!("{{\"to\": \"{}\"}}", "x".repeat(300));
    let carrying = c
        .enqueue(
            EnqueueRequest::new("outbox", "send")
                .unwrap()
                .with_payload(body.clone().into_bytes(), "application/json")
                .with_custom_entry("tenant", "acme"),
        )
        .await
        .unwrap()
        .job_id;
    let table = cli.ok(&["job", &carrying]);
    let line = |field: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(field))
            .unwrap_or_else(|| panic!("no {field} in {table}"))
    };
    assert!(
        line("payload_encoding").ends_with("application/json"),
        "{table}"
    );
    let payload = line("payload");
    assert!(payload.contains("{\"to\": \"xxx"), "{payload}");
    assert!(
        payload.ends_with(&format!("… ({} bytes in all)", body.len())),
        "{payload}"
    );
    assert!(payload.len() < 200, "one line, cut: {payload}");
    assert!(line("custom.tenant").ends_with("acme"), "{table}");
    let info = cli.json(&["job", &carrying]);
    assert_eq!(info["payload"]["encoding"], "application/json");
    assert_eq!(info["payload"]["bytes"], body.len());
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD
        .decode(info["payload"]["data_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(data, body.as_bytes());
    assert_eq!(info["custom"]["tenant"], "acme");
    let listed = cli.json(&["jobs", "outbox"]);
    assert_eq!(listed["jobs"][0]["job_id"], carrying.as_str());
    assert!(listed["jobs"][0].get("payload").is_none(), "{listed}");

    // A server that is not there: named, with what to check.
    let out = Command::new(sepp_bin())
        .args(["queues", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the server running"));

    // A reader that has gone away before the output (`sepp queues | head -0`): the command ends
    // quietly instead of panicking. The pipe's read end is closed before the command starts
    // writing, so every write it makes fails with EPIPE.
    let mut child = Command::new(sepp_bin())
        .args(["queues"])
        .env("SEPP_SERVER", server.url())
        .env("SEPP_API_KEY", KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The queue `q` of `sepp queues --output json`.
fn queue_row(cli: &Cli, q: &str) -> Value {
    cli.json(&["queues"])["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["queue"] == q)
        .cloned()
        .unwrap_or_else(|| panic!("queue {q} listed"))
}

#[tokio::test]
async fn enqueue_from_a_jsonl_file_creates_each_keyed_line_once_and_key_forget_frees_a_key() {
    let dir = tempfile::tempdir().unwrap();
    // Batches of 2, so that the 5 jobs of the file go out in three calls.
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[auth]\napi_keys = [{{ name = \"ops\", key = \"{KEY}\" }}]\n\
         [limits]\nmax_enqueue_batch = 2\n",
        dir.path().join("data").display()
    );
    let server = ServerProcess::start(dir.path(), &toml);
    let cli = Cli { url: server.url() };
    let file = dir.path().join("orders.jsonl");
    let first = r#"{"order": "a", "to": "x@example.com"}"#;
    std::fs::write(
        &file,
        format!(
            "{first}\n{{\"order\": \"b\"}}\n\n{{\"name\": \"no order\"}}\nnot json\n\
             {{\"order\": 7}}\n{{\"order\": \"a\", \"again\": true}}\n{{\"order\": \"c\"}}\n"
        ),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let args = [
        "enqueue",
        "orders",
        "--job-type",
        "ship",
        "--from",
        f,
        "--key-field",
        "order",
        "--output",
        "json",
    ];

    // Two bad lines: reported with their numbers and skipped; exit 1 saying so.
    let (code, out, err) = cli.run(&args);
    assert_eq!(code, 1, "{err}");
    let sum: Value = serde_json::from_str(&out).expect("json summary");
    assert_eq!(sum["lines"], 7);
    assert_eq!(sum["created"], 4);
    assert_eq!(sum["already_enqueued"], 1, "the second line keyed \"a\"");
    assert_eq!(
        (sum["skipped"].clone(), sum["rejected"].clone()),
        (2.into(), 0.into())
    );
    assert!(err.contains("line 4: no \"order\" field"), "{err}");
    assert!(err.contains("line 5: not JSON"), "{err}");
    assert!(err.contains("2 of 7 lines were not enqueued"), "{err}");
    // Piped: one plain progress line per batch, the last one complete.
    assert!(
        err.contains("7/7 lines: 4 jobs created, 1 already enqueued (same key), 2 skipped"),
        "{err}"
    );
    assert_eq!(queue_row(&cli, "orders")["ready"], 4);

    // Running it again creates nothing.
    let (code, out, _) = cli.run(&args);
    assert_eq!(code, 1);
    let again: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (again["created"].clone(), again["already_enqueued"].clone()),
        (0.into(), 5.into())
    );
    assert_eq!(queue_row(&cli, "orders")["ready"], 4);

    // Each job's payload is its line, as JSON; its key the field's value (a number as text).
    let key_a = cli.json(&["key", "orders", "a"]);
    let key_7 = cli.json(&["key", "orders", "7"]);
    assert_eq!(key_7["job"]["job_type"], "ship");
    let c = SeppClient::builder(server.url())
        .api_key(KEY)
        .connect()
        .await
        .unwrap();
    let jobs = c
        .reserve(ReserveOptions::new(["orders"], Duration::from_secs(30)).with_max_jobs(10))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 4);
    let a = jobs.iter().find(|j| j.id == key_a["job_id"]).unwrap();
    let p = a.payload.clone().unwrap();
    assert_eq!(
        (p.data.as_slice(), p.encoding.as_str()),
        (first.as_bytes(), "application/json")
    );

    // key forget: the key's record goes; the next run creates a new job for that line only.
    let forgot = cli.json(&["key", "forget", "orders", "b"]);
    assert_eq!(forgot["forgotten"], true);
    let (code, _, err) = cli.run(&["key", "orders", "b"]);
    assert_eq!(code, 1);
    assert!(err.contains("no live dedup record"), "{err}");
    let (code, _, err) = cli.run(&["key", "forget", "orders", "b"]);
    assert_eq!(code, 1);
    assert!(err.contains("nothing to forget"), "{err}");
    let (_, out, _) = cli.run(&args);
    let third: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (third["created"].clone(), third["already_enqueued"].clone()),
        (1.into(), 4.into())
    );
    assert_eq!(queue_row(&cli, "orders")["ready"], 1);

    // A clean file exits 0; a batch size over the server's limit is refused naming it.
    let clean = dir.path().join("clean.jsonl");
    std::fs::write(&clean, "{\"order\": \"z\"}\n").unwrap();
    let c_args = [
        "enqueue",
        "orders",
        "--job-type",
        "ship",
        "--from",
        clean.to_str().unwrap(),
        "--key-field",
        "order",
    ];
    let out = cli.ok(&c_args);
    assert!(out.contains("1 line: 1 job created"), "{out}");
    let mut big = c_args.to_vec();
    big.extend(["--batch-size", "3"]);
    let (code, _, err) = cli.run(&big);
    assert_eq!(code, 1);
    assert!(err.contains("max_enqueue_batch is 2"), "{err}");
    let (code, _, err) = cli.run(&[
        "enqueue",
        "orders",
        "--job-type",
        "ship",
        "--from",
        "/nonexistent.jsonl",
        "--key-field",
        "order",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read --from /nonexistent.jsonl"),
        "{err}"
    );

    // `--from -` reads standard input, once, as it comes: progress without a total.
    let piped = |input: &str| {
        use std::io::Write;
        let mut child = Command::new(sepp_bin())
            .args(["enqueue", "piped", "--job-type", "ship", "--from", "-"])
            .args(["--key-field", "order", "--output", "json"])
            .env("SEPP_SERVER", &cli.url)
            .env("SEPP_API_KEY", KEY)
            .env_remove("SEPP_CONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        let sum: Value = serde_json::from_slice(&out.stdout).expect("json summary");
        (sum, err)
    };
    let input = "{\"order\": \"s1\"}\n\n{\"order\": \"s2\"}\n{\"order\": \"s3\"}\n";
    let (sum, err) = piped(input);
    assert_eq!(
        (sum["lines"].clone(), sum["created"].clone()),
        (3.into(), 3.into()),
        "{err}"
    );
    assert!(
        err.contains("3 lines: 3 jobs created, 0 already enqueued (same key)"),
        "{err}"
    );
    assert_eq!(queue_row(&cli, "piped")["ready"], 3);
    let (sum, _) = piped(input);
    assert_eq!(
        (sum["created"].clone(), sum["already_enqueued"].clone()),
        (0.into(), 3.into())
    );
}

/// A start with `dead_letter_retention_ms = 0` over dead letters that an earlier start kept
/// warns, with their number, before its first sweep deletes them.
#[tokio::test]
async fn a_start_without_retention_warns_before_deleting_kept_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[storage]\ndead_letter_retention_ms = 600000\n",
        data.display()
    );
    {
        let mut server = ServerProcess::start(dir.path(), &toml);
        let c = SeppClient::builder(server.url()).connect().await.unwrap();
        let j = common::enqueue_and_lease(&c, "mail").await;
        c.nack(&j.id, j.attempt, NackRetry::DeadLetter, None)
            .await
            .unwrap();
        server.kill9();
    }
    // Started again without the setting (the default, 0): no config file this time.
    let _ = std::fs::remove_file(dir.path().join("sepp.toml"));
    let mut cmd = Command::new(sepp_bin());
    cmd.current_dir(dir.path())
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_SERVER__DB_PATH", &data)
        .env("SEPP_LOG", "warn");
    let (_, err) = common::start_up_log(cmd);
    let warning = err
        .lines()
        .find(|l| l.contains("dead_letter_retention_ms is 0"))
        .unwrap_or_else(|| panic!("no warning in {err}"));
    assert!(
        warning.contains("deletes the 1 dead letters stored") && warning.contains("WARN"),
        "{warning}"
    );
}
