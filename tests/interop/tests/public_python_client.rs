//! The public Python client (`sepp-py` from PyPI, in its own virtual environment, run as a
//! black box) against our server binary. `make test-interop` prepares the environment and sets
//! `PUBLIC_SEPP_PY`; without it this suite fails rather than skips.

use sepp_server::testing::{ServerProcess, TempDir};
use std::path::PathBuf;
use std::process::Command;

fn our_server_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug/sepp");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --bin sepp`",
        bin.display()
    );
    bin
}

/// Runs `script` with the public client against our server; returns its standard output.
fn run_public_client(script: &str) -> String {
    run_public_client_with(script, "")
}

/// As [`run_public_client`], with `extra` appended to the server's config.
fn run_public_client_with(script: &str, extra: &str) -> String {
    let python = std::env::var_os("PUBLIC_SEPP_PY")
        .map(PathBuf::from)
        .expect(
            "PUBLIC_SEPP_PY must name a python with sepp-py installed (run `make test-interop`)",
        );
    let dir = TempDir::new();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n[storage]\ndead_letter_retention_ms = 60000\n{extra}",
        dir.path().join("data").display()
    );
    let server = ServerProcess::start(&our_server_bin(), dir.path(), &toml);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new(python)
        .arg(script)
        .arg(server.url())
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

#[test]
fn the_public_python_client_works_against_our_server() {
    let stdout = run_public_client("public_client_walkthrough.py");
    assert!(stdout.contains("walkthrough ok"), "{stdout}");
}

/// Issue 18's opt-in features configured for other queues (key conflicts, debounce, a
/// recurring schedule ticking every second) change nothing for the public client's queues.
#[test]
fn the_public_python_client_works_with_key_conflicts_and_debounce_on_for_other_queues() {
    let stdout = run_public_client_with(
        "public_client_walkthrough.py",
        "[[queues]]\nname = \"strict\"\nkey_conflict = \"reject\"\n\
         [[queues]]\nname = \"debounced\"\non_duplicate = \"replace_pending\"\n\
         [[schedules]]\nname = \"tick\"\nqueue = \"scheduled\"\njob_type = \"tick\"\n\
         every_ms = 1000\ncatch_up = true\n",
    );
    assert!(stdout.contains("walkthrough ok"), "{stdout}");
}

/// sepp-py keeps gRPC's 4 MiB receive limit: five 1 MB jobs in one Reserve used to make a
/// reply it could not read, and the leased jobs were lost (issue 11).
#[test]
fn five_1mb_jobs_reach_the_public_python_client() {
    let stdout = run_public_client("public_client_big_jobs.py");
    assert!(stdout.contains("all 5 delivered"), "{stdout}");
}
