//! `sepp enqueue QUEUE --job-type TYPE --from FILE.jsonl --key-field FIELD`: bulk enqueue of a
//! JSON Lines file, one job per line, keyed by one field of each line so that running the same
//! command again (after a crash, a Ctrl-C, a failed call) creates nothing twice.
//!
//! Each non-blank line must be a JSON object holding FIELD (a string, or a number used as its
//! decimal text); the line itself, as written, is the job's payload (`application/json`). A line
//! that is not JSON, not an object, or lacks FIELD is reported on standard error with its line
//! number and skipped. Lines go out in batches of the server's `max_enqueue_batch` through the
//! client core (`sepp_rs`), which checks each job and retries a batch only when that is safe
//! (every job in it is keyed, so it is). Progress: a bar with the rate and the time left on a
//! terminal, one plain line per batch otherwise. `--from -` reads standard input; it, like any
//! other pipe, is read once, as it comes, so its progress has no total.

use super::{Conn, Failure, Output, counted};
use indicatif::{ProgressBar, ProgressStyle};
use sepp_rs::client::TlsOptions;
use sepp_rs::{EnqueueRequest, SeppClient};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, IsTerminal, Seek};
use std::path::Path;

/// The flags of `sepp enqueue`.
#[derive(clap::Args, Debug)]
pub(crate) struct EnqueueArgs {
    /// The queue.
    queue: String,
    /// The job type of every job.
    #[arg(long, value_name = "TYPE")]
    job_type: String,
    /// A JSON Lines file: one JSON object per line, each one job's payload; `-` reads standard
    /// input.
    #[arg(long, value_name = "FILE.jsonl")]
    from: std::path::PathBuf,
    /// The field of each line whose value is the job's idempotency key.
    #[arg(long, value_name = "FIELD")]
    key_field: String,
    /// Jobs per call (default and ceiling: the server's limits.max_enqueue_batch).
    #[arg(long, value_name = "N")]
    batch_size: Option<u32>,
}

/// One line of the file turned into a job, or why it is skipped.
#[derive(Debug, PartialEq)]
pub(crate) enum Line {
    /// Blank: nothing to do, nothing to report.
    Blank,
    /// A job: its idempotency key and its payload (the line as written).
    Job { key: String, payload: String },
    /// Reported and skipped.
    Skip(String),
}

/// Reads one line of the file.
pub(crate) fn parse_line(text: &str, key_field: &str) -> Line {
    let text = text.trim();
    if text.is_empty() {
        return Line::Blank;
    }
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Line::Skip(format!("not JSON ({e})")),
    };
    let Value::Object(m) = &v else {
        return Line::Skip(format!(
            "not a JSON object, so it has no {key_field:?} field for the idempotency key"
        ));
    };
    let key = match m.get(key_field) {
        None => {
            return Line::Skip(format!(
                "no {key_field:?} field (--key-field) for the idempotency key"
            ));
        }
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Line::Skip(format!(
                "field {key_field:?} is {}, expected a non-empty string or a number",
                match other {
                    Value::String(_) => "an empty string",
                    Value::Null => "null",
                    Value::Bool(_) => "a boolean",
                    Value::Array(_) => "an array",
                    _ => "an object",
                }
            ));
        }
    };
    Line::Job {
        key,
        payload: text.to_string(),
    }
}

/// What a run did.
#[derive(Debug, Default)]
struct Tally {
    lines: u64,
    created: u64,
    existing: u64,
    skipped: u64,
    rejected: u64,
}

/// Progress output: a bar on a terminal, plain lines otherwise (both on standard error).
struct Progress {
    bar: Option<ProgressBar>,
    /// The number of non-blank lines, when the input could be read twice to count them.
    total: Option<u64>,
}

impl Progress {
    fn new(total: Option<u64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let (b, template) = match total {
                Some(n) => (
                    ProgressBar::new(n),
                    "{bar:40} {pos}/{len} lines  {rate}  eta {eta}  {msg}",
                ),
                None => (
                    ProgressBar::new_spinner(),
                    "{spinner} {pos} lines  {rate}  {msg}",
                ),
            };
            b.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .with_key(
                        "rate",
                        |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = write!(w, "{:.0} lines/s", s.per_sec());
                        },
                    ),
            );
            b
        });
        Progress { bar, total }
    }

    /// Reports a skipped or rejected line above the bar.
    fn note(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(format!("sepp: {msg}")),
            None => eprintln!("sepp: {msg}"),
        }
    }

    fn batch_done(&self, t: &Tally) {
        match &self.bar {
            Some(b) => {
                b.set_position(t.lines);
                b.set_message(format!(
                    "{} created, {} already enqueued",
                    counted(t.created, "job", "jobs"),
                    t.existing
                ));
            }
            None => eprintln!(
                "{}{} {}: {} created, {} already enqueued (same key), {} skipped, {} rejected",
                t.lines,
                self.total.map(|n| format!("/{n}")).unwrap_or_default(),
                if self.total.unwrap_or(t.lines) == 1 {
                    "line"
                } else {
                    "lines"
                },
                counted(t.created, "job", "jobs"),
                t.existing,
                t.skipped,
                t.rejected
            ),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The input of `--from`, and its number of non-blank lines when it is a regular file (read a
/// first time to count them). Standard input (`-`) and other pipes or devices are read only
/// once, so their total is unknown.
fn open(path: &Path) -> Result<(Box<dyn BufRead>, Option<u64>), Failure> {
    if path.as_os_str() == "-" {
        return Ok((Box::new(std::io::stdin().lock()), None));
    }
    let err = |e: std::io::Error| Failure(format!("cannot read --from {}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(err)?;
    let mut total = None;
    if f.metadata().map_err(err)?.is_file() {
        total = Some(
            BufReader::new(&f)
                .lines()
                .map_while(Result::ok)
                .filter(|l| !l.trim().is_empty())
                .count() as u64,
        );
        f.rewind().map_err(err)?;
    }
    Ok((Box::new(BufReader::new(f)), total))
}

/// How the input is named in messages.
fn input_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "standard input".into()
    } else {
        path.display().to_string()
    }
}

async fn connect(conn: &Conn) -> Result<SeppClient, Failure> {
    let mut b = SeppClient::builder(conn.server.clone());
    if let Some(k) = &conn.api_key {
        b = b.api_key(k.clone());
    }
    if let Some(path) = &conn.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| Failure(format!("cannot read --ca-cert {}: {e}", path.display())))?;
        b = b.tls(TlsOptions {
            ca_pem: Some(pem),
            ..TlsOptions::default()
        });
    }
    b.connect().await.map_err(|e| {
        Failure(format!(
            "cannot connect to {} ({e}): is the server running there? (--server / SEPP_SERVER)",
            conn.server
        ))
    })
}

/// Sends `jobs` (line number, request) as one batch and counts the outcomes.
async fn send(
    client: &SeppClient,
    jobs: &mut Vec<(u64, EnqueueRequest)>,
    t: &mut Tally,
    progress: &Progress,
) -> Result<(), Failure> {
    if jobs.is_empty() {
        return Ok(());
    }
    let (numbers, requests): (Vec<u64>, Vec<EnqueueRequest>) =
        std::mem::take(jobs).into_iter().unzip();
    let first = numbers[0];
    let results = client.enqueue_batch(requests).await.map_err(|e| {
        Failure(format!(
            "the batch starting at line {first} failed: {e}. Lines before it are enqueued; run \
             the same command again: lines already enqueued are not created twice"
        ))
    })?;
    for (n, r) in numbers.into_iter().zip(results) {
        match r {
            Ok(ack) if ack.deduplicated => t.existing += 1,
            Ok(_) => t.created += 1,
            Err(rej) => {
                t.rejected += 1;
                progress.note(&format!("line {n}: rejected: {rej}"));
            }
        }
    }
    Ok(())
}

/// Runs `sepp enqueue`.
pub(crate) async fn run(conn: &Conn, args: EnqueueArgs) -> Result<(), Failure> {
    if args.key_field.is_empty() {
        return Err(Failure(
            "--key-field is empty: name a field of the lines".into(),
        ));
    }
    // The total, for the time left, is counted before connecting (a first pass over a file).
    let (input, total) = open(&args.from)?;
    let client = connect(conn).await?;
    let server_max = client.max_enqueue_batch().unwrap_or(1000);
    let batch = match args.batch_size {
        Some(0) => return Err(Failure("--batch-size is 0: give at least 1".into())),
        Some(n) if n > server_max => {
            return Err(Failure(format!(
                "--batch-size is {n}, the server's limits.max_enqueue_batch is {server_max}"
            )));
        }
        Some(n) => n,
        None => server_max,
    } as usize;
    let progress = Progress::new(total);
    let mut t = Tally::default();
    let mut jobs: Vec<(u64, EnqueueRequest)> = Vec::with_capacity(batch);
    for (i, line) in input.lines().enumerate() {
        let n = i as u64 + 1;
        let line = line.map_err(|e| {
            Failure(format!(
                "cannot read line {n} of {}: {e}",
                input_name(&args.from)
            ))
        })?;
        match parse_line(&line, &args.key_field) {
            Line::Blank => continue,
            Line::Skip(why) => {
                t.lines += 1;
                t.skipped += 1;
                progress.note(&format!("line {n}: {why}; skipped"));
                continue;
            }
            Line::Job { key, payload } => {
                t.lines += 1;
                let r = EnqueueRequest::new(&args.queue, &args.job_type)
                    .map_err(|e| Failure(format!("{e} (QUEUE or --job-type)")))?
                    .with_idempotency_key(key)
                    .with_payload(payload.into_bytes(), "application/json");
                jobs.push((n, r));
            }
        }
        if jobs.len() >= batch {
            send(&client, &mut jobs, &mut t, &progress).await?;
            progress.batch_done(&t);
        }
    }
    send(&client, &mut jobs, &mut t, &progress).await?;
    progress.batch_done(&t);
    progress.finish();
    let summary = json!({
        "queue": args.queue,
        "lines": t.lines,
        "created": t.created,
        "already_enqueued": t.existing,
        "skipped": t.skipped,
        "rejected": t.rejected,
    });
    if conn.output == Output::Json {
        super::print_json(&summary);
    } else {
        super::emit(format_args!(
            "{}: {} created, {} already enqueued (same key), {} skipped, {} rejected",
            counted(t.lines, "line", "lines"),
            counted(t.created, "job", "jobs"),
            t.existing,
            t.skipped,
            t.rejected
        ));
    }
    if t.skipped + t.rejected > 0 {
        return Err(Failure(format!(
            "{} of {} lines were not enqueued (see the lines above); fix them and run the same \
             command again",
            t.skipped + t.rejected,
            t.lines
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_becomes_a_keyed_job_or_is_skipped_saying_why() {
        assert_eq!(
            parse_line(" {\"id\": \"a-1\", \"n\": 2}\n", "id"),
            Line::Job {
                key: "a-1".into(),
                payload: "{\"id\": \"a-1\", \"n\": 2}".into()
            }
        );
        assert_eq!(
            parse_line("{\"id\": 17}", "id"),
            Line::Job {
                key: "17".into(),
                payload: "{\"id\": 17}".into()
            }
        );
        assert_eq!(parse_line("   ", "id"), Line::Blank);
        for (line, why) in [
            ("{\"other\": 1}", "no \"id\" field"),
            ("{\"id\": \"\"}", "an empty string"),
            ("{\"id\": null}", "null"),
            ("[1, 2]", "not a JSON object"),
            ("{\"id\": ", "not JSON"),
        ] {
            match parse_line(line, "id") {
                Line::Skip(m) => assert!(m.contains(why), "{line}: {m}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }
}
