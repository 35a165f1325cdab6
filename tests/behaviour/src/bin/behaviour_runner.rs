//! The Rust runner of the cross-language behaviour suite (`tests/behaviour/scenarios.json`; the
//! steps are described there). `behaviour-runner URL SCENARIOS OUT RUN` runs every scenario
//! through the Rust client against the server at URL and writes what it observed to OUT, in the
//! format the Python (`runner.py`) and Node (`runner.mjs`) runners write too. To restart the
//! server it prints `restart-server` and waits for `restarted` on standard input.

use sepp_rs::admin::{JobInfo, JobState};
use sepp_rs::job::DeadLetterCause;
use sepp_rs::worker::WorkerReport;
use sepp_rs::{
    EnqueueError, EnqueueRequest, HandlerError, LeaseError, Payload, Rejection, SeppClient,
    TraceContext, Value as CustomValue, Worker,
};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// How long a wait step may take before the run fails.
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, scenarios, out, run] = args.as_slice() else {
        eprintln!("usage: behaviour-runner URL SCENARIOS OUT RUN");
        return std::process::ExitCode::FAILURE;
    };
    match run_all(url, scenarios, out, run).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("behaviour-runner: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_all(url: &str, scenarios: &str, out: &str, run: &str) -> Result<(), Failure> {
    let script: Value = serde_json::from_str(&std::fs::read_to_string(scenarios)?)?;
    let mut runner = Runner {
        client: SeppClient::connect(url).await?,
        run: run.to_string(),
        jobs: HashMap::new(),
        worker: None,
    };
    let mut results = Vec::new();
    for scenario in script["scenarios"].as_array().ok_or("no scenarios")? {
        let mut records = Vec::new();
        for step in scenario["steps"].as_array().ok_or("no steps")? {
            let (kind, arg) = step
                .as_object()
                .and_then(|o| o.iter().next())
                .ok_or("an empty step")?;
            if let Some(record) = runner.step(kind, arg).await? {
                records.push(json!({ "step": kind, "record": record }));
            }
        }
        results.push(json!({ "name": scenario["name"], "records": records }));
    }
    std::fs::write(
        out,
        serde_json::to_string_pretty(&json!({ "scenarios": results }))?,
    )?;
    Ok(())
}

/// A worker running in the background.
struct Running {
    task: JoinHandle<Result<WorkerReport, LeaseError>>,
    /// Ends the run.
    stop: Arc<Notify>,
    /// Set when the step asks the worker to stop: what `finish_on_stop` handlers wait for.
    stopping: watch::Sender<bool>,
    /// Handlers started so far.
    started: Arc<AtomicUsize>,
}

struct Runner {
    client: SeppClient,
    run: String,
    /// Job ids by the names the scenario gave them.
    jobs: HashMap<String, String>,
    worker: Option<Running>,
}

impl Runner {
    async fn step(&mut self, kind: &str, arg: &Value) -> Result<Option<Value>, Failure> {
        Ok(match kind {
            "enqueue" => {
                let (request, name) = self.request(arg)?;
                let result = self.client.enqueue(request).await;
                if let (Ok(ack), Some(name)) = (&result, name) {
                    self.jobs.insert(name, ack.job_id.clone());
                }
                Some(match result {
                    Ok(ack) => json!({ "accepted": true, "deduplicated": ack.deduplicated }),
                    Err(EnqueueError::Rejected(r)) => json!({ "rejected": rejection(&r) }),
                    Err(EnqueueError::Client(e)) => json!({ "error": e.code().as_str() }),
                })
            }
            "enqueue_batch" => {
                let (requests, names) = self.requests(arg)?;
                let results = self.client.enqueue_batch(requests).await?;
                let mut record = Vec::new();
                for (result, name) in results.into_iter().zip(names) {
                    record.push(match result {
                        Ok(ack) => {
                            if let Some(name) = name {
                                self.jobs.insert(name, ack.job_id.clone());
                            }
                            json!({ "accepted": true, "deduplicated": ack.deduplicated })
                        }
                        Err(r) => json!({ "rejected": rejection(&r) }),
                    });
                }
                Some(Value::Array(record))
            }
            "enqueue_atomic" => {
                let (requests, _) = self.requests(arg)?;
                Some(match self.client.enqueue_atomic(requests).await? {
                    Ok(acks) => json!({ "committed": acks.len() }),
                    Err(failures) => json!({
                        "rejected": failures
                            .iter()
                            .map(|(i, r)| json!({ "index": i, "rejection": rejection(r) }))
                            .collect::<Vec<_>>()
                    }),
                })
            }
            "start_worker" => {
                self.start_worker(arg)?;
                None
            }
            "wait_started" => {
                let n = arg.as_u64().ok_or("wait_started takes a count")? as usize;
                let started = self.running()?.started.clone();
                wait_until("handlers to start", || {
                    let started = started.clone();
                    async move { started.load(Ordering::SeqCst) >= n }
                })
                .await?;
                None
            }
            "wait_jobs" => {
                for (name, state) in arg.as_object().ok_or("wait_jobs takes an object")? {
                    let id = self.job(name)?;
                    let state = state.as_str().ok_or("a state")?.to_string();
                    let client = self.client.clone();
                    wait_until(&format!("job {name:?} to be {state}"), || {
                        let (client, id, state) = (client.clone(), id.clone(), state.clone());
                        async move {
                            match client.get_job(&id).await {
                                Ok(info) => reached(state_name(info.state), &state),
                                Err(_) => false,
                            }
                        }
                    })
                    .await?;
                }
                None
            }
            "stop_worker" => {
                let running = self.worker.take().ok_or("no worker is running")?;
                running.stopping.send_replace(true);
                running.stop.notify_one();
                let r = running.task.await??;
                Some(json!({
                    "acked": r.acked,
                    "nacked": r.nacked,
                    "lease_lost": r.lease_lost,
                    "abandoned": r.abandoned,
                }))
            }
            "restart_server" => {
                println!("restart-server");
                std::io::stdout().flush()?;
                let line = tokio::task::spawn_blocking(|| {
                    let mut line = String::new();
                    std::io::stdin().lock().read_line(&mut line).map(|_| line)
                })
                .await??;
                if line.trim() != "restarted" {
                    return Err(format!("expected `restarted`, got {line:?}").into());
                }
                None
            }
            "jobs" => {
                let mut record = Map::new();
                for name in arg.as_array().ok_or("jobs takes a list")? {
                    let name = name.as_str().ok_or("a job name")?;
                    let info = self.client.get_job(&self.job(name)?).await?;
                    record.insert(name.to_string(), job_record(&info));
                }
                Some(Value::Object(record))
            }
            "carried" => {
                let mut record = Map::new();
                for name in arg.as_array().ok_or("carried takes a list")? {
                    let name = name.as_str().ok_or("a job name")?;
                    let info = self.client.get_job(&self.job(name)?).await?;
                    record.insert(name.to_string(), carried_record(&info));
                }
                Some(Value::Object(record))
            }
            "dead_letters" => {
                let queue = self.text(arg)?;
                let page = self
                    .client
                    .list_dead_letters(Some(&queue), Some(100), None)
                    .await?;
                let mut records: Vec<Value> = page
                    .records
                    .iter()
                    .map(|r| {
                        json!({
                            "job_type": r.job.job_type,
                            "cause": cause_name(r.cause),
                            "final_attempt": r.final_attempt,
                            "last_reason": r.last_reason,
                        })
                    })
                    .collect();
                records.sort_by_key(|r| r["job_type"].to_string());
                Some(Value::Array(records))
            }
            "queue_stats" => {
                let s = self.client.get_queue_stats(&self.text(arg)?).await?;
                Some(json!({
                    "ready": s.ready,
                    "scheduled": s.scheduled,
                    "in_flight": s.in_flight,
                    "dead_lettered": s.dead_lettered,
                }))
            }
            other => return Err(format!("unknown step {other:?}").into()),
        })
    }

    fn running(&self) -> Result<&Running, Failure> {
        Ok(self.worker.as_ref().ok_or("no worker is running")?)
    }

    fn job(&self, name: &str) -> Result<String, Failure> {
        Ok(self
            .jobs
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no job named {name:?}"))?)
    }

    /// A string of the script: `{run}` replaced, or `{"repeat": [s, n]}`.
    fn text(&self, v: &Value) -> Result<String, Failure> {
        if let Some(s) = v.as_str() {
            return Ok(s.replace("{run}", &self.run));
        }
        let r = v["repeat"].as_array().ok_or("a string or a repeat")?;
        let s = r[0].as_str().ok_or("repeat takes a string")?;
        Ok(s.repeat(r[1].as_u64().ok_or("repeat takes a count")? as usize))
    }

    fn requests(
        &self,
        specs: &Value,
    ) -> Result<(Vec<EnqueueRequest>, Vec<Option<String>>), Failure> {
        let mut requests = Vec::new();
        let mut names = Vec::new();
        for spec in specs.as_array().ok_or("a list of jobs")? {
            let (request, name) = self.request(spec)?;
            requests.push(request);
            names.push(name);
        }
        Ok((requests, names))
    }

    /// The request a job spec describes (built field by field: the checks are the client's,
    /// when it is sent), and its name.
    fn request(&self, spec: &Value) -> Result<(EnqueueRequest, Option<String>), Failure> {
        let text = |key: &str| spec.get(key).map(|v| self.text(v)).transpose();
        let number = |key: &str| spec.get(key).and_then(Value::as_u64);
        let mut custom = BTreeMap::new();
        for (k, v) in spec
            .get("custom")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let value = match v {
                Value::Bool(b) => CustomValue::Bool(*b),
                Value::String(s) => CustomValue::String(s.clone()),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => CustomValue::Int(i),
                    None => CustomValue::Double(n.as_f64().unwrap_or_default()),
                },
                _ => return Err("a custom value is a string, number or boolean".into()),
            };
            custom.insert(k.clone(), value);
        }
        let request = EnqueueRequest {
            queue: text("queue")?.unwrap_or_default(),
            job_type: text("job_type")?.unwrap_or_default(),
            payload: spec.get("payload").map(|p| Payload {
                data: p["data"].as_str().unwrap_or_default().as_bytes().to_vec(),
                encoding: p["encoding"].as_str().unwrap_or_default().to_string(),
            }),
            idempotency_key: text("idempotency_key")?,
            priority: number("priority").map(|n| n as u32),
            max_attempts: number("max_attempts").map(|n| n as u32),
            custom,
            trace_context: match text("traceparent")? {
                Some(traceparent) => Some(TraceContext {
                    traceparent,
                    tracestate: text("tracestate")?,
                }),
                None => None,
            },
            scheduled_at: number("scheduled_in_ms")
                .map(|ms| SystemTime::now() + Duration::from_millis(ms)),
        };
        Ok((request, text("as")?))
    }

    fn start_worker(&mut self, spec: &Value) -> Result<(), Failure> {
        let queues = spec["queues"]
            .as_array()
            .ok_or("start_worker takes queues")?
            .iter()
            .map(|q| self.text(q))
            .collect::<Result<Vec<_>, _>>()?;
        let ms = |key: &str| {
            spec.get(key)
                .and_then(Value::as_u64)
                .map(Duration::from_millis)
        };
        let mut builder = Worker::builder(self.client.clone(), queues)
            .wait_timeout(ms("wait_timeout_ms").unwrap_or(Duration::from_millis(500)));
        if let Some(d) = ms("lease_duration_ms") {
            builder = builder.lease_duration(d);
        }
        if let Some(on) = spec.get("auto_extend").and_then(Value::as_bool) {
            builder = builder.auto_extend(on);
        }
        if let Some(n) = spec.get("max_in_flight").and_then(Value::as_u64) {
            builder = builder.max_in_flight(n as usize);
        }
        if let Some(d) = ms("shutdown_timeout_ms") {
            builder = builder.shutdown_timeout(d);
        }
        if let Some(d) = ms("handler_timeout_ms") {
            builder = builder.handler_timeout(d);
        }
        let started = Arc::new(AtomicUsize::new(0));
        let (stopping, _) = watch::channel(false);
        for (job_type, behaviour) in spec["handlers"]
            .as_object()
            .ok_or("start_worker takes handlers")?
        {
            let behaviour = Behaviour::from_script(behaviour)?;
            let (started, stopping) = (started.clone(), stopping.subscribe());
            builder = builder.handle(job_type.clone(), move |_ctx| {
                let (behaviour, mut stopping) = (behaviour.clone(), stopping.clone());
                started.fetch_add(1, Ordering::SeqCst);
                async move {
                    match behaviour {
                        Behaviour::Ack => Ok(()),
                        Behaviour::Retry(reason) => Err(HandlerError::retry().with_reason(reason)),
                        Behaviour::RetryAfter(delay, reason) => {
                            Err(HandlerError::retry_after(delay).with_reason(reason))
                        }
                        Behaviour::Permanent(reason) => {
                            Err(HandlerError::permanent().with_reason(reason))
                        }
                        Behaviour::Raise(message) => Err(std::io::Error::other(message).into()),
                        // Dropped by the worker when the engine lets go of the job.
                        Behaviour::Hang => std::future::pending().await,
                        Behaviour::FinishOnStop => {
                            let _ = stopping.wait_for(|s| *s).await;
                            Ok(())
                        }
                    }
                }
            });
        }
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(builder.build().run_until({
            let stop = stop.clone();
            async move { stop.notified().await }
        }));
        self.worker = Some(Running {
            task,
            stop,
            stopping,
            started,
        });
        Ok(())
    }
}

/// What a scripted handler does.
#[derive(Debug, Clone)]
enum Behaviour {
    Ack,
    Retry(String),
    RetryAfter(Duration, String),
    Permanent(String),
    Raise(String),
    Hang,
    FinishOnStop,
}

impl Behaviour {
    fn from_script(v: &Value) -> Result<Self, Failure> {
        if let Some(s) = v.as_str() {
            return Ok(match s {
                "ack" => Behaviour::Ack,
                "hang" => Behaviour::Hang,
                "finish_on_stop" => Behaviour::FinishOnStop,
                other => return Err(format!("unknown behaviour {other:?}").into()),
            });
        }
        let (kind, arg) = v
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or("a behaviour")?;
        let reason = |a: &Value| a.as_str().unwrap_or_default().to_string();
        Ok(match kind.as_str() {
            "retry" => Behaviour::Retry(reason(arg)),
            "retry_after" => Behaviour::RetryAfter(
                Duration::from_millis(arg[0].as_u64().unwrap_or_default()),
                reason(&arg[1]),
            ),
            "permanent" => Behaviour::Permanent(reason(arg)),
            "raise" => Behaviour::Raise(reason(arg)),
            other => return Err(format!("unknown behaviour {other:?}").into()),
        })
    }
}

/// Polls `check` until it holds, failing after [`DEADLINE`].
async fn wait_until<F, Fut>(what: &str, check: F) -> Result<(), Failure>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Whether a job in `state` has reached `wanted` (`gone`: acked, or forgotten).
fn reached(state: &str, wanted: &str) -> bool {
    match wanted {
        "gone" => state == "UNKNOWN" || state == "ACKED",
        _ => state == wanted,
    }
}

fn rejection(r: &Rejection) -> Value {
    let f = r.fields();
    let mut fields = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            fields.insert(k.to_string(), v);
        }
    };
    put("queue", json!(f.queue));
    put("limit", json!(f.limit));
    put("actual", json!(f.actual));
    put("encoding", json!(f.encoding));
    put("allowed", json!(f.allowed));
    put("job_type", json!(f.job_type));
    put("key", json!(f.key));
    json!({ "code": r.code().as_str(), "message": r.to_string(), "fields": fields })
}

fn job_record(info: &JobInfo) -> Value {
    json!({
        "state": state_name(info.state),
        "attempt": info.attempt,
        "dead_letter_cause": info.dead_letter_cause.map(cause_name),
        "last_reason": info.last_reason,
    })
}

/// What GetJob says the job carries: the payload (its bytes in hex), custom entries and trace
/// context.
fn carried_record(info: &JobInfo) -> Value {
    let custom: Map<String, Value> = info
        .custom
        .iter()
        .map(|(k, v)| {
            let v = match v {
                CustomValue::String(s) => json!(s),
                CustomValue::Double(d) => json!(d),
                CustomValue::Int(i) => json!(i),
                CustomValue::Bool(b) => json!(b),
            };
            (k.clone(), v)
        })
        .collect();
    json!({
        "payload": info.payload.as_ref().map(|p| json!({
            "encoding": p.encoding,
            "data_hex": p.data.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        })),
        "custom": custom,
        "trace_context": info.trace_context.as_ref().map(|t| json!({
            "traceparent": t.traceparent,
            "tracestate": t.tracestate,
        })),
    })
}

fn state_name(s: JobState) -> &'static str {
    s.as_str()
}

fn cause_name(c: DeadLetterCause) -> &'static str {
    match c {
        DeadLetterCause::Unspecified => "UNSPECIFIED",
        DeadLetterCause::AttemptsExhausted => "ATTEMPTS_EXHAUSTED",
        DeadLetterCause::Rejected => "REJECTED",
        DeadLetterCause::LeaseExpired => "LEASE_EXPIRED",
        DeadLetterCause::Admin => "ADMIN",
    }
}
