//! The `sepp` binary as a process: flags, config errors, the readiness line, graceful shutdown.

mod common;

use common::{ServerProcess, sepp_bin};
use std::process::Command;
use std::time::{Duration, Instant};

/// `sepp`, with none of the `SEPP_*` variables of the environment the tests run in (a make
/// target's, a developer's), which would change the config or add warnings.
fn sepp() -> Command {
    let mut cmd = Command::new(sepp_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SEPP_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn run(args: &[&str], config: Option<&str>) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sepp();
    cmd.args(args).current_dir(dir.path());
    if let Some(text) = config {
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, text).unwrap();
        cmd.arg("--config").arg(&p);
        // A valid listen address so that only the config under test can fail.
        cmd.env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0");
    }
    let out = cmd.output().expect("run sepp");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_and_help_print_and_exit_zero() {
    let (code, out, _) = run(&["--version"], None);
    assert_eq!(code, 0);
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    let (code, out, _) = run(&["--help"], None);
    assert_eq!(code, 0);
    assert!(out.contains("--config"), "{out}");
    for needle in ["SEPP_SERVER__LISTEN_ADDR", "SEPP_CONFIG", "SEPP_LOG"] {
        assert!(
            out.contains(needle),
            "--help does not mention {needle}: {out}"
        );
    }
}

#[test]
fn a_client_flag_without_a_subcommand_is_refused_instead_of_starting_a_server() {
    let (code, out, err) = run(&["--server", "http://127.0.0.1:21082"], None);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "a server started: {out}");
    assert!(
        err.contains("--server names the server that the client subcommands")
            && err.contains("server.listen_addr")
            && err.contains("SEPP_SERVER__LISTEN_ADDR"),
        "{err}"
    );
    let (code, out, err) = run(&["--api-key", "k"], None);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "a server started: {out}");
    assert!(
        err.contains("--api-key is an option of the client subcommands"),
        "{err}"
    );
}

#[test]
fn a_server_flag_sepp_does_not_have_gets_the_config_key_to_use() {
    let (code, out, err) = run(&["--port", "50052"], None);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "a server started: {out}");
    assert!(
        err.contains("unexpected argument '--port'")
            && err.contains("tip: the server's address is the config key server.listen_addr")
            && err.contains("SEPP_SERVER__LISTEN_ADDR=127.0.0.1:50061 sepp"),
        "{err}"
    );
    let (code, _, err) = run(&["--data-dir=/tmp/x"], None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("tip: the data directory is the config key server.db_path"),
        "{err}"
    );
    // With a client subcommand, an address flag means the server to talk to.
    let (code, _, err) = run(&["queues", "--port", "50052"], None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("tip: the server to talk to is --server URL (or SEPP_SERVER)"),
        "{err}"
    );
    // Other unknown flags keep clap's own message.
    let (code, _, err) = run(&["--frobnicate"], None);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("config key"), "{err}");
}

#[test]
fn client_subcommands_beside_the_servers_config_talk_to_its_listen_addr() {
    let server_dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n",
        server_dir.path().join("data").display()
    );
    let server = ServerProcess::start(server_dir.path(), &toml);
    // An operator's directory whose sepp.toml says where the server listens (on every
    // interface: the subcommands reach it on loopback).
    let ops = tempfile::tempdir().unwrap();
    std::fs::write(
        ops.path().join("sepp.toml"),
        format!(
            "[server]\nlisten_addr = \"0.0.0.0:{}\"\n",
            server.addr.port()
        ),
    )
    .unwrap();
    let out = sepp()
        .args(["pause", "beside-config"])
        .current_dir(ops.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("paused beside-config, a new queue"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The queue was paused on that server.
    let out = sepp()
        .args(["queues", "-o", "json", "--server", &server.url()])
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains("\"beside-config\"") && json.contains("\"paused\": true"),
        "{json}"
    );
    // --server and SEPP_SERVER still win over the config.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", free.local_addr().unwrap());
    drop(free);
    let out = sepp()
        .args(["queues"])
        .current_dir(ops.path())
        .env("SEPP_SERVER", &dead)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot connect to {dead} (transport error)")),
        "{err}"
    );
    // A config naming a server that is not there says where the address came from.
    std::fs::write(
        ops.path().join("sepp.toml"),
        format!(
            "[server]\nlisten_addr = \"{}\"\n",
            dead.trim_start_matches("http://")
        ),
    )
    .unwrap();
    let out = sepp()
        .args(["queues"])
        .current_dir(ops.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot connect to {dead} (from server.listen_addr of sepp.toml)"
        )),
        "{err}"
    );
}

#[test]
fn sepp_server_in_the_environment_does_not_stop_a_server_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(sepp_bin());
    cmd.current_dir(dir.path())
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER", "http://127.0.0.1:21082")
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_SERVER__DB_PATH", dir.path().join("data"))
        .env("SEPP_LOG", "warn");
    let (line, _) = common::start_up_log(cmd);
    assert!(line.starts_with("sepp listening on 127.0.0.1:"), "{line:?}");
}

#[test]
fn a_taken_port_names_the_key_and_the_variable_that_change_it() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(sepp_bin())
        .current_dir(dir.path())
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER__LISTEN_ADDR", &addr)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(err.contains("server.listen_addr"), "{err}");
    assert!(err.contains("SEPP_SERVER__LISTEN_ADDR"), "{err}");
}

#[test]
fn config_example_matches_the_compiled_defaults() {
    let (code, out, _) = run(&["config", "example"], None);
    assert_eq!(code, 0);
    let parsed = sepp_server::config::Config::from_toml_with_env(&out, &[])
        .expect("the example parses")
        .config;
    // Nothing declared either: a server started with it lists no queue a server without it
    // would not.
    assert_eq!(parsed, sepp_server::config::Config::default());
}

#[test]
fn config_check_takes_config_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my.toml");
    std::fs::write(&path, "[limits]\nmax_enqueue_batch = 7\n").unwrap();
    let p = path.to_str().unwrap();
    for args in [
        ["config", "check", "--config", p],
        ["config", "check", "-c", p],
        ["--config", p, "config", "check"],
    ] {
        let (code, out, err) = run(&args, None);
        assert_eq!(code, 0, "sepp {args:?}: {err}");
        assert!(
            out.contains("max_enqueue_batch = 7"),
            "sepp {args:?}: {out}"
        );
    }
}

#[test]
fn config_check_prints_the_warnings_a_start_would_log_and_exits_0() {
    let (code, out, err) = run(
        &["config", "check"],
        Some(
            "[metrics]\nfoo = 1\n[tracing]\nbar = 2\n[cluster]\nnodes = 3\n[limits]\nmax_enqueue_batch = 7\n",
        ),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_enqueue_batch = 7"), "{out}");
    // First where the values came from: the file, then each variable that set a key.
    let (file, rest) = err.split_once('\n').unwrap_or_default();
    assert!(
        file.starts_with("sepp: config file: /") && file.ends_with("/bad.toml"),
        "{err}"
    );
    assert_eq!(
        rest,
        "sepp: server.listen_addr set by SEPP_SERVER__LISTEN_ADDR\n\
         sepp: warning: config sections not implemented by this server are ignored: cluster\n\
         sepp: warning: config keys not implemented by this server are ignored: metrics.foo, tracing.bar\n"
    );
}

#[test]
fn a_sepp_variable_sepp_does_not_read_is_warned_about_with_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = sepp()
        .current_dir(dir.path())
        .env("SEPP_STORAGE_PERSIST_MODE", "buffer")
        .env("SEPP_TEST_ANYTHING", "1")
        .env("SEPP_BENCH_BIN", "/usr/bin/sepp")
        .env("SEPP_SERVER", "http://127.0.0.1:1")
        .env("SEPP_CA_CERT", "/nonexistent.pem")
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("persist_mode = \"sync_all\""));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "sepp: no config file (no --config, no SEPP_CONFIG, no ./sepp.toml): the defaults and \
         the environment\n\
         sepp: warning: environment variable SEPP_STORAGE_PERSIST_MODE is not one sepp reads \
         and is ignored; did you mean SEPP_STORAGE__PERSIST_MODE?\n"
    );

    // At start, the same as a log line.
    let mut cmd = sepp();
    cmd.current_dir(dir.path())
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_SERVER__DB_PATH", dir.path().join("data"))
        .env("SEPP_LOG", "warn")
        .env("SEPP_STORAGE_PERSIST_MODE", "buffer");
    let (_, err) = common::start_up_log(cmd);
    let warning = err
        .lines()
        .find(|l| l.contains("environment variable not read by sepp is ignored"))
        .unwrap_or_else(|| panic!("no warning in {err}"));
    assert!(
        warning.contains("SEPP_STORAGE_PERSIST_MODE")
            && warning.contains("SEPP_STORAGE__PERSIST_MODE"),
        "{warning}"
    );
}

#[test]
fn a_bad_config_exits_1_with_one_line_naming_the_key_the_value_and_the_rule() {
    let cases: &[(&str, &[&str])] = &[
        ("[limits]\nmax_enqueue_btch = 3\n", &["max_enqueue_btch"]),
        (
            "[limits]\nmax_enqueue_batch = \"lots\"\n",
            &["limits.max_enqueue_batch", "lots"],
        ),
        (
            "[limits]\ndefault_priority = 12\n",
            &["limits.default_priority", "12", "0 to 9"],
        ),
        (
            "[limits]\nretry_delay_ms = 10\nretry_delay_max_ms = 5\n",
            &["retry_delay_max_ms = 5", "retry_delay_ms = 10"],
        ),
        (
            "[server]\ntls_cert_path = \"/tmp/cert.pem\"\n",
            &["tls_key_path"],
        ),
        (
            "[[queues]]\nname = \"a\"\n[[queues]]\nname = \"a\"\n",
            &["queues[1].name", "duplicate"],
        ),
        (
            "[limits]\nmax_reserve_reply_bytes = 1000000\n",
            &[
                "limits.max_reserve_reply_bytes = 1000000",
                "limits.max_payload_bytes = 1048576",
                "cannot hold one job",
            ],
        ),
        (
            "[[queues]]\nname = \"big\"\nmax_payload_bytes = 8000000\n",
            &[
                "limits.max_reserve_reply_bytes = 4194304",
                "queues[0].max_payload_bytes = 8000000",
            ],
        ),
        (
            "[[queues]]\nname = \"a\\u200Bb\"\n",
            &["queues[0].name", "U+200B", "Cf"],
        ),
        (
            "[storage]\npersist_mode = \"sometimes\"\n",
            &["storage.persist_mode", "sometimes"],
        ),
        (
            "[metrics]\nlisten_addr = \"localhost:9464\"\n",
            &[
                "config key metrics.listen_addr",
                "\"localhost:9464\" is not an IP address and port",
                "host names are not resolved",
            ],
        ),
        (
            "[limits]\nmax_payload_bytes = \"1MB\"\n",
            &[
                "config key limits.max_payload_bytes: \"1MB\" is not a number of bytes",
                "e.g. 1048576",
            ],
        ),
        ("this is not toml", &["TOML"]),
    ];
    for (text, needles) in cases {
        let (code, out, err) = run(&[], Some(text));
        assert_eq!(code, 1, "config {text:?}: stderr {err}");
        assert!(out.is_empty(), "config {text:?} printed {out}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "config {text:?}: {err}");
        for n in *needles {
            assert!(
                lines[0].contains(n),
                "config {text:?}: {:?} lacks {n:?}",
                lines[0]
            );
        }
    }
}

#[test]
fn a_toml_syntax_error_names_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sepp.toml");
    std::fs::write(&path, "[limits]\nmax_enqueue_batch = 3\n[storage\n").unwrap();
    let p = path.to_str().unwrap();
    for args in [vec!["--config", p], vec!["config", "check", "--config", p]] {
        let (code, out, err) = run(&args, None);
        assert_eq!(code, 1, "sepp {args:?}: {err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(
            err,
            format!("sepp: {p}:3:9: not valid TOML: unclosed table, expected `]`\n")
        );
    }
}

#[test]
fn an_unknown_environment_override_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(sepp_bin())
        .current_dir(dir.path())
        .env("SEPP_LIMITS__MAX_ENQUEUE_BATCH", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limits.max_enqueue_batch = 0"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("(from SEPP_LIMITS__MAX_ENQUEUE_BATCH)"),
        "{err}"
    );
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let out = sepp()
        .current_dir(dir.path())
        .env("SEPP_LIMITS__MAX_PAYLOAD_BYTES", "abc")
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sepp: config key limits.max_payload_bytes: ")
            && err.contains("abc")
            && err.ends_with(" (from SEPP_LIMITS__MAX_PAYLOAD_BYTES)\n"),
        "{err}"
    );
}

fn terminate(p: &sepp_server::testing::ServerProcess) {
    let pid = p.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_waiting_reserves_empty_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[metrics]\nenabled = true\nlisten_addr = \"127.0.0.1:0\"\n",
        dir.path().join("data").display()
    );
    // The server logs when a Reserve starts waiting: the signal that it waits.
    let mut p = start_logged_with(dir.path(), &toml, "info,sepp_server::queue::reserve=debug");
    let client = sepp_rs::SeppClient::connect(format!("http://{}", p.addr))
        .await
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .reserve(
                    sepp_rs::ReserveOptions::new(["idle"], Duration::from_secs(30))
                        .with_wait_timeout(Duration::from_secs(60)),
                )
                .await
        })
    };
    tokio::task::block_in_place(|| p.line_time("reserve waiting"));
    let t0 = Instant::now();
    p.terminate();
    let jobs = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting reserve returned")
        .unwrap()
        .expect("an empty result, not an error");
    assert!(jobs.is_empty());
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    let (_, status) = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(10)));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_second_server_on_the_same_data_directory_exits_1_saying_the_directory_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let toml = format!("[server]\ndb_path = \"{}\"\n", data.display());
    let first = ServerProcess::start(dir.path(), &toml);
    let out = Command::new(sepp_bin())
        .current_dir(dir.path())
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_SERVER__DB_PATH", &data)
        .output()
        .expect("run sepp");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("holds its lock") && err.contains(&data.display().to_string()),
        "{err}"
    );
    terminate(&first);
}

/// A `sepp` process whose standard error is read line by line, each line with the time it
/// arrived, so a test can tell how long the process lived after a given log line.
struct LoggedProcess {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    lines: std::sync::mpsc::Receiver<(Instant, String)>,
}

fn start_logged(dir: &std::path::Path, toml: &str) -> LoggedProcess {
    start_logged_with(dir, toml, "info")
}

/// As [`start_logged`], with `SEPP_LOG` set to `log`.
fn start_logged_with(dir: &std::path::Path, toml: &str, log: &str) -> LoggedProcess {
    use std::io::BufRead;
    let cfg = dir.join("sepp.toml");
    std::fs::write(&cfg, toml).unwrap();
    let mut child = Command::new(sepp_bin())
        .arg("--config")
        .arg(&cfg)
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_LOG", log)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("sepp listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    LoggedProcess { child, addr, lines }
}

impl LoggedProcess {
    /// Waits up to `limit` for the process to exit; kills it and panics if it does not.
    fn wait_exit(&mut self, limit: Duration) -> (Instant, std::process::ExitStatus) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (Instant::now(), status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("sepp still running {limit:?} after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// When the line containing `needle` arrived.
    fn line_time(&self, needle: &str) -> Instant {
        let mut seen = Vec::new();
        while let Ok((t, line)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            if line.contains(needle) {
                return t;
            }
            seen.push(line);
        }
        panic!("no line containing {needle:?} in {seen:#?}");
    }

    fn terminate(&self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
    }
}

impl Drop for LoggedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sigterm_with_idle_and_half_open_sockets_exits_within_the_grace_period() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // Timeouts far beyond the test, so only the grace period can end these connections.
    let toml = format!(
        "[server]\ndb_path = \"{}\"\nhandshake_timeout_ms = 600000\nidle_timeout_ms = 600000\nshutdown_grace_ms = 300\n",
        dir.path().join("data").display()
    );
    let mut p = start_logged(dir.path(), &toml);
    let silent = std::net::TcpStream::connect(p.addr).unwrap();
    let mut half = std::net::TcpStream::connect(p.addr).unwrap();
    half.write_all(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..12])
        .unwrap();
    let mut idle = std::net::TcpStream::connect(p.addr).unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    // The server's SETTINGS frame: the idle connection is served.
    let mut header = [0u8; 9];
    idle.read_exact(&mut header).unwrap();
    assert_eq!(header[3], 4, "a SETTINGS frame first");
    let t0 = Instant::now();
    p.terminate();
    let (exited, status) = p.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let took = exited - t0;
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    drop((silent, half, idle));
}

#[test]
fn the_process_exits_soon_after_storage_flushed_even_with_full_memtables() {
    // 100,000 keyed jobs written just before SIGTERM leave 300,000 entries (job, meta, key) in
    // fjall's memtables. Freeing them entry by entry after the line, which the binary no longer
    // does (`Stopped::leak_for_exit`), took 0.3–0.5 s with a debug build (0.1–0.25 s with a
    // release build and 100,000 jobs); the bound is 200 ms (now: 10–25 ms here).
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[storage]\npersist_mode = \"buffer\"\n[limits]\nmax_enqueue_batch = 5000\n",
        dir.path().join("data").display()
    );
    let mut p = start_logged(dir.path(), &toml);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async {
        let client = sepp_rs::SeppClient::connect(format!("http://{}", p.addr))
            .await
            .unwrap();
        let producers = (0..4).map(|w| {
            let client = client.clone();
            tokio::spawn(async move {
                for b in 0..5 {
                    let batch = (0..5000)
                        .map(|i| {
                            sepp_rs::EnqueueRequest::new("q", "t")
                                .unwrap()
                                .with_idempotency_key(format!("k{w}-{b}-{i}"))
                        })
                        .collect();
                    for r in client.enqueue_batch(batch).await.unwrap() {
                        r.unwrap();
                    }
                }
            })
        });
        for p in producers.collect::<Vec<_>>() {
            p.await.unwrap();
        }
        client
    });
    p.terminate();
    let flushed = p.line_time("storage flushed; stopped");
    let (exited, status) = p.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let after = exited.saturating_duration_since(flushed);
    eprintln!("exited {after:?} after \"storage flushed; stopped\"");
    assert!(
        after < Duration::from_millis(200),
        "exited {after:?} after the line"
    );
    drop(client);
}

/// The server turns transparent huge pages off for its process (docs/configuration.md), unless
/// `MIMALLOC_ALLOW_THP` leaves the choice to mimalloc.
#[cfg(target_os = "linux")]
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n",
        dir.path().join("data").display()
    );
    assert!(
        std::env::var_os("MIMALLOC_ALLOW_THP").is_none(),
        "run this test without MIMALLOC_ALLOW_THP in the environment"
    );
    let server = ServerProcess::start(dir.path(), &toml);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("a kernel that reports THP_enabled");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
