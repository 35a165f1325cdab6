//! The cross-language behaviour suite: `scenarios.json` run by the Rust, Python and Node
//! clients, one after the other, against one real server (the binary, with the config below),
//! which a scenario restarts mid-run. The server's records of each run (GetJob's state, attempt,
//! dead-letter cause and last reason, and what the job carries: payload, custom entries, trace
//! context; ListDeadLetters; queue counts), the rejections and the workers' counts must be
//! identical across the three; ids and times are left out.
//!
//! `make test-behaviour` builds what it needs and sets `SEPP_TEST_SERVER_BIN` and
//! `SEPP_TEST_BEHAVIOUR_PYTHON` (a Python with the `sepp` package installed); `node` runs the Node
//! runner against `js/` (built). A missing runtime fails the suite, it never skips.

use sepp_server::testing::{ServerProcess, TempDir};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The server binary, from `SEPP_TEST_SERVER_BIN` (which `make test-behaviour` sets).
fn server_bin() -> PathBuf {
    let bin = PathBuf::from(
        std::env::var_os("SEPP_TEST_SERVER_BIN")
            .expect("SEPP_TEST_SERVER_BIN must name the sepp binary (run `make test-behaviour`)"),
    );
    assert!(bin.exists(), "{} is missing", bin.display());
    bin
}

/// The server every run talks to: keys up to 1,024 bytes (a client must not refuse 300),
/// retries ten minutes away (so a retried job stays scheduled while it is looked at), dead
/// letters kept, leases expired within ~50 ms, and one queue with every restriction.
fn config(dir: &Path) -> String {
    format!(
        r#"[server]
db_path = "{}"

[storage]
dead_letter_retention_ms = 3600000
sweep_interval_ms = 50

[limits]
max_idempotency_key_bytes = 1024
retry_delay_ms = 600000

[[queues]]
name = "limited"
allowed_job_types = ["ok"]
max_payload_bytes = 8
allowed_encodings = ["application/json"]
max_custom_entries = 2
max_custom_key_bytes = 8
max_custom_total_bytes = 24
max_schedule_horizon_ms = 60000
"#,
        dir.join("data").display()
    )
}

/// Runs one language's runner to its end, restarting the server when it asks; returns what
/// it recorded.
fn run(name: &str, mut command: Command, server: &mut ServerProcess, dir: &Path) -> Value {
    let out = dir.join(format!("{name}.json"));
    command
        .arg(server.url())
        .arg(here().join("scenarios.json"))
        .arg(&out)
        .arg(name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the {name} runner: {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    for line in stdout.lines() {
        let line = line.expect("runner output");
        if line.trim() == "restart-server" {
            let addr = server.addr.to_string();
            server.kill9();
            *server = ServerProcess::start_on(&server_bin(), dir, &config(dir), &addr);
            println!("{name}: the server was killed (SIGKILL) and started again on {addr}");
            writeln!(stdin, "restarted").expect("tell the runner");
        } else {
            println!("{name}: {line}");
        }
    }
    let status = child.wait().expect("runner exit");
    assert!(status.success(), "the {name} runner failed: {status}");
    serde_json::from_str(&std::fs::read_to_string(&out).expect("records")).expect("JSON")
}

/// The first place where two runs' records differ, in words.
fn difference(a: &Value, b: &Value) -> Option<String> {
    let (sa, sb) = (a["scenarios"].as_array()?, b["scenarios"].as_array()?);
    for (x, y) in sa.iter().zip(sb) {
        let (rx, ry) = (x["records"].as_array()?, y["records"].as_array()?);
        for (i, (p, q)) in rx.iter().zip(ry).enumerate() {
            if p != q {
                return Some(format!(
                    "scenario {}, record {i}:\n{}\nvs\n{}",
                    x["name"],
                    serde_json::to_string_pretty(p).unwrap_or_default(),
                    serde_json::to_string_pretty(q).unwrap_or_default()
                ));
            }
        }
        if rx.len() != ry.len() {
            return Some(format!("scenario {}: record counts differ", x["name"]));
        }
    }
    (sa.len() != sb.len()).then(|| "scenario counts differ".to_string())
}

#[test]
fn the_three_clients_leave_identical_records_on_the_server() {
    let dir = TempDir::new();
    let mut server = ServerProcess::start(&server_bin(), dir.path(), &config(dir.path()));
    let python = std::env::var_os("SEPP_TEST_BEHAVIOUR_PYTHON").expect(
        "SEPP_TEST_BEHAVIOUR_PYTHON must name a python with the sepp package (run `make test-behaviour`)",
    );
    let node = std::env::var_os("SEPP_TEST_BEHAVIOUR_NODE").unwrap_or_else(|| "node".into());

    let rust = run(
        "rust",
        Command::new(env!("CARGO_BIN_EXE_behaviour-runner")),
        &mut server,
        dir.path(),
    );
    let mut py = Command::new(python);
    py.arg(here().join("runner.py"));
    let python = run("python", py, &mut server, dir.path());
    let mut js = Command::new(node);
    js.arg(here().join("runner.mjs"));
    let node = run("node", js, &mut server, dir.path());

    // The records, for a reader of the test's output (`--no-capture`).
    for s in rust["scenarios"].as_array().into_iter().flatten() {
        let n = s["records"].as_array().map_or(0, Vec::len);
        println!(
            "identical in rust, python and node: {} ({n} records)",
            s["name"]
        );
    }
    if let Some(dir) = std::env::var_os("SEPP_TEST_BEHAVIOUR_KEEP") {
        for (name, records) in [("rust", &rust), ("python", &python), ("node", &node)] {
            let path = PathBuf::from(&dir).join(format!("{name}.json"));
            std::fs::write(path, serde_json::to_string_pretty(records).unwrap()).unwrap();
        }
    }
    for (name, other) in [("python", &python), ("node", &node)] {
        if let Some(d) = difference(&rust, other) {
            panic!("the rust and {name} runs differ at {d}");
        }
        assert_eq!(&rust, other, "the rust and {name} runs differ");
    }

    // And they are right, not only alike: a few records checked by value.
    let records = |scenario: usize| rust["scenarios"][scenario]["records"].clone();
    let validation = records(0);
    assert_eq!(
        validation[0]["record"]["rejected"]["message"],
        "invalid request: queue: queue name is empty"
    );
    // A 300-byte key, under the server's 1,024: accepted, and a dedup hit in the same batch.
    assert_eq!(validation[28]["record"][0]["accepted"], true);
    assert_eq!(validation[28]["record"][3]["deduplicated"], true);
    let outcomes = records(1);
    let jobs = &outcomes[outcomes.as_array().unwrap().len() - 2]["record"];
    assert_eq!(jobs["raise"]["last_reason"], "boom");
    assert_eq!(
        jobs["no handler"]["last_reason"],
        "no handler for job type \"nobody\""
    );
    let lost = records(2);
    assert_eq!(
        lost[2]["record"]["stuck"]["dead_letter_cause"],
        "LEASE_EXPIRED"
    );
    assert_eq!(lost[1]["record"]["lease_lost"], 1);
    let shutdown = records(4);
    assert_eq!(
        shutdown[3]["record"]["hangs"]["last_reason"],
        "worker shut down before the job finished"
    );
    let restart = records(5);
    assert_eq!(restart[1]["record"]["deduplicated"], true, "{restart}");
    let carried = records(6);
    let carried = &carried[5]["record"];
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        carried["full"],
        serde_json::json!({
            "payload": {
                "encoding": "application/json",
                "data_hex": hex(r#"{"order": 17, "note": "crème brûlée"}"#),
            },
            "custom": {
                "tenant": "acme", "city": "Zürich", "retries_left": 3, "below_zero": -7,
                "ratio": 1.5, "urgent": true,
            },
            "trace_context": {
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "tracestate": "congo=t61rcWkgMzE",
            },
        }),
        "{carried}"
    );
    let nothing = serde_json::json!({ "payload": null, "custom": {}, "trace_context": null });
    assert_eq!(carried["bare"], nothing, "{carried}");
    // An acked job leaves only a tombstone, without its content; a dead letter keeps it.
    assert_eq!(carried["acked"], nothing, "{carried}");
    assert_eq!(
        carried["dead letter"]["payload"]["data_hex"],
        hex("not json"),
        "{carried}"
    );
    assert_eq!(carried["dead letter"]["custom"]["attempted"], false);
    assert_eq!(
        carried["dead letter"]["trace_context"]["tracestate"],
        Value::Null
    );
}
