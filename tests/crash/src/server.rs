//! The server under test: the real `sepp` binary, started from a config template, killed with
//! SIGKILL, restarted on the same address and data directory.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a start may take before it counts as failed (recovery replays the journal).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where and how to run the server.
pub struct ServerSpec {
    /// The `sepp` binary.
    pub bin: PathBuf,
    /// The config file, after substitution.
    pub config: String,
    /// Working directory: the config file and the server's log go here.
    pub work: PathBuf,
}

/// The config the harness writes unless `--config` names a template: the embedded backend
/// in `@DATA_DIR@`, `@PERSIST_MODE@`, dead letters kept (so that a dead-lettered job stays
/// visible to the checker), `@MIN_FREE_BYTES@`, and the debounce queue of the load's
/// debouncers.
pub const DEFAULT_TEMPLATE: &str = r#"[server]
db_path = "@DATA_DIR@"

[storage]
persist_mode = "@PERSIST_MODE@"
dead_letter_retention_ms = 86400000
min_free_bytes = @MIN_FREE_BYTES@

[[queues]]
name = "crash-debounce"
on_duplicate = "replace_pending"
"#;

/// Fills a config template's placeholders.
pub fn render(template: &str, data_dir: &Path, persist_mode: &str, min_free_bytes: u64) -> String {
    template
        .replace("@DATA_DIR@", &data_dir.display().to_string())
        .replace("@PERSIST_MODE@", persist_mode)
        .replace("@MIN_FREE_BYTES@", &min_free_bytes.to_string())
}

/// A running server.
pub struct Server {
    child: Child,
    /// The address from its readiness line.
    pub addr: String,
}

impl ServerSpec {
    /// Starts the server listening on `addr` (`127.0.0.1:0` the first time) and waits for its
    /// readiness line. Its standard error is appended to `WORK/sepp.log`.
    pub fn start(&self, addr: &str) -> Result<Server, String> {
        let cfg = self.work.join("sepp.toml");
        std::fs::write(&cfg, &self.config)
            .map_err(|e| format!("writing {}: {e}", cfg.display()))?;
        let log_path = self.work.join("sepp.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let mut child = Command::new(&self.bin)
            .arg("--config")
            .arg(&cfg)
            .env("SEPP_SERVER__LISTEN_ADDR", addr)
            .env(
                "SEPP_LOG",
                std::env::var("SEPP_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(r);
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("reading the readiness line: {e}"));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no readiness line within {START_TIMEOUT:?}"));
            }
        };
        match line.trim().strip_prefix("sepp listening on ") {
            Some(a) => Ok(Server {
                child,
                addr: a.to_string(),
            }),
            None => {
                let status = child.wait().ok();
                Err(format!(
                    "the server did not start (first line {line:?}, exit {status:?}); log: {}\n{}",
                    log_path.display(),
                    tail(&log_path, 20)
                ))
            }
        }
    }
}

impl Server {
    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL, then reap.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit; SIGKILL after 30 s.
    pub fn stop(mut self) -> Result<(), String> {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        for _ in 0..300 {
            if let Some(st) = self.child.try_wait().map_err(|e| e.to_string())? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("the server exited with {st}"))
                };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill9();
        Err("the server did not stop within 30 s of SIGTERM".into())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
