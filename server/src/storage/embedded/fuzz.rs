//! What the fuzz targets need of the embedded store's internals (`crate::testing::fuzz` holds
//! the targets' entry points): its record codecs, and raw access to the records of a data
//! directory, to put arbitrary bytes in one of them.

use super::codec::{Body, DedupRecord, Meta, QueueRecord, Stage, decode_id, split_record_key};
use super::group_commit::Keyspaces;
use super::recovery::{SENTINEL, open_db};
use crate::domain::{DeadLetterCause, JobId, Payload, TraceContext, Value};
use crate::storage::StorageError;
use std::collections::BTreeMap;
use std::path::Path;

fn value_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        // Bit for bit: a NaN stays the same NaN.
        (Value::Double(x), Value::Double(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

fn body_eq(a: &Body, b: &Body) -> bool {
    a.job_type == b.job_type
        && a.payload == b.payload
        && a.trace_context == b.trace_context
        && a.scheduled_at == b.scheduled_at
        && a.idempotency_key == b.idempotency_key
        && a.custom.len() == b.custom.len()
        && a.custom
            .iter()
            .zip(&b.custom)
            .all(|((ka, va), (kb, vb))| ka == kb && value_eq(va, vb))
}

/// Decodes `data[1..]` as the record kind `data[0]` selects (job body, job meta, dedup record,
/// queue record, job key, dedup key). Decoding never panics; a record that decodes encodes to
/// bytes that decode to the same record.
///
/// # Panics
/// On a bug: a panic while decoding, or a decoded record that does not survive its own
/// encoding.
pub fn codec_bytes(data: &[u8]) {
    let Some((&kind, buf)) = data.split_first() else {
        return;
    };
    match kind % 6 {
        0 => {
            if let Ok(b) = Body::decode(buf) {
                let again = Body::decode(&b.encode()).expect("an encoded body decodes");
                assert!(body_eq(&again, &b), "{b:?} came back as {again:?}");
            }
        }
        1 => {
            if let Ok(m) = Meta::decode(buf) {
                assert_eq!(
                    Meta::decode(&m.encode()).expect("an encoded meta decodes"),
                    m
                );
            }
        }
        2 => {
            if let Ok(d) = DedupRecord::decode(buf) {
                assert_eq!(DedupRecord::decode(&d.encode()).expect("decodes"), d);
            }
            if let Ok((key, d)) = DedupRecord::decode_logged(buf) {
                let again = d.encode_logged(key);
                assert_eq!(
                    DedupRecord::decode_logged(&again).expect("decodes"),
                    (key, d)
                );
            }
        }
        3 => {
            if let Ok(q) = QueueRecord::decode(buf) {
                assert_eq!(QueueRecord::decode(&q.encode()).expect("decodes"), q);
            }
        }
        4 => {
            if let Ok(id) = decode_id(buf) {
                assert_eq!(id.to_bytes().as_slice(), buf);
            }
        }
        _ => {
            if let Some((queue, key)) = split_record_key(buf)
                && !queue.contains('\0')
            {
                let k = super::codec::record_key(queue, key);
                assert_eq!(k, buf);
            }
        }
    }
}

/// Reads plain values from the fuzzer's bytes (zeros once they run out).
struct Source<'a>(&'a [u8]);

impl Source<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u64(&mut self) -> u64 {
        let mut a = [0u8; 8];
        let b = self.bytes(8);
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    }
    fn i64(&mut self) -> i64 {
        self.u64() as i64
    }
    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn vec(&mut self) -> Vec<u8> {
        let n = usize::from(self.u8());
        self.bytes(n).to_vec()
    }
    fn string(&mut self) -> String {
        String::from_utf8_lossy(&self.vec()).into_owned()
    }
    fn opt_string(&mut self) -> Option<String> {
        self.bool().then(|| self.string())
    }
    fn opt_i64(&mut self) -> Option<i64> {
        self.bool().then(|| self.i64())
    }
    fn cause(&mut self) -> DeadLetterCause {
        [
            DeadLetterCause::AttemptsExhausted,
            DeadLetterCause::Rejected,
            DeadLetterCause::LeaseExpired,
            DeadLetterCause::Admin,
        ][usize::from(self.u8() % 4)]
    }
}

/// Builds a record of the kind `data[0]` selects from the rest of the bytes, encodes it and
/// decodes it: decode of encode is the identity.
///
/// # Panics
/// When a record does not come back from its encoding as it was.
pub fn codec_values(data: &[u8]) {
    let mut s = Source(data);
    match s.u8() % 4 {
        0 => {
            let mut custom = BTreeMap::new();
            for _ in 0..s.u8() % 8 {
                let k = s.string();
                let v = match s.u8() % 4 {
                    0 => Value::String(s.string()),
                    1 => Value::Double(f64::from_bits(s.u64())),
                    2 => Value::Int(s.i64()),
                    _ => Value::Bool(s.bool()),
                };
                custom.insert(k, v);
            }
            let b = Body {
                job_type: s.string(),
                payload: s.bool().then(|| Payload {
                    data: s.vec(),
                    encoding: s.string(),
                }),
                trace_context: s.bool().then(|| TraceContext {
                    traceparent: s.string(),
                    tracestate: s.opt_string(),
                }),
                custom,
                scheduled_at: s.opt_i64(),
                idempotency_key: s.opt_string(),
            };
            let again = Body::decode(&b.encode()).expect("an encoded body decodes");
            assert!(body_eq(&again, &b), "{b:?} came back as {again:?}");
        }
        1 => {
            let stage = match s.u8() % 5 {
                0 => Stage::Ready,
                1 => Stage::Scheduled { due: s.i64() },
                2 => Stage::InFlight { expires: s.i64() },
                3 => Stage::Dead {
                    cause: s.cause(),
                    failed_at: s.i64(),
                },
                _ => Stage::Tombstone {
                    finished_at: s.i64(),
                    until: s.i64(),
                    dead: s.bool().then(|| s.cause()),
                },
            };
            let m = Meta {
                queue: s.string().into(),
                job_type: s.string().into(),
                priority: s.u8(),
                seq: s.u64(),
                enqueued_at: s.i64(),
                attempt: s.u32(),
                max_attempts: s.u32(),
                stage,
                worker_id: s.opt_string(),
                last_reason: s.opt_string(),
                dedup_until: s.opt_i64(),
                reply_bytes: s.u32(),
                body_seq: s.bool().then(|| s.u64()),
            };
            assert_eq!(
                Meta::decode(&m.encode()).expect("an encoded meta decodes"),
                m
            );
        }
        2 => {
            let d = DedupRecord {
                job_id: JobId(u128::from(s.u64()) << 64 | u128::from(s.u64())),
                created_at: s.i64(),
                expires_at: s.i64(),
                fingerprint: crate::domain::Fingerprint::new(s.u64()),
            };
            assert_eq!(DedupRecord::decode(&d.encode()).expect("decodes"), d);
            let key = s.u64().to_le_bytes();
            assert_eq!(
                DedupRecord::decode_logged(&d.encode_logged(&key)).expect("decodes"),
                (key.as_slice(), d)
            );
        }
        _ => {
            let q = QueueRecord { paused: s.bool() };
            assert_eq!(QueueRecord::decode(&q.encode()).expect("decodes"), q);
        }
    }
}

/// The keyspaces of a data directory, in the order [`read_records`] and [`insert_record`]
/// number them.
pub const KEYSPACES: [&str; 7] = [
    "jobs",
    "meta",
    "dedup",
    "queues",
    "info",
    "bodies",
    "dedup_log",
];

/// One record: its keyspace (an index into [`KEYSPACES`]), key and value.
pub type RawRecord = (usize, Vec<u8>, Vec<u8>);

fn io(e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(e.to_string())
}

/// The keyspaces in the order of [`KEYSPACES`].
fn in_order<'a>(ks: &'a Keyspaces, info: &'a fjall::Keyspace) -> [&'a fjall::Keyspace; 7] {
    [
        &ks.jobs,
        &ks.meta,
        &ks.dedup,
        &ks.queues,
        info,
        &ks.bodies,
        &ks.dedup_log,
    ]
}

/// Every record of the (closed) data directory at `path`, sentinels left out.
///
/// # Errors
/// When the directory cannot be opened or read.
pub fn read_records(path: &Path) -> Result<Vec<RawRecord>, StorageError> {
    let ks = open_db(path)?;
    let info = ks.db.keyspace("info", Default::default).map_err(io)?;
    let mut out = Vec::new();
    for (i, k) in in_order(&ks, &info).into_iter().enumerate() {
        for guard in k.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            if &*key != SENTINEL {
                out.push((i, key.to_vec(), value.to_vec()));
            }
        }
    }
    Ok(out)
}

/// Adds `record` to the (closed) data directory at `path`, over any record of the same key,
/// durably, and closes it.
///
/// # Errors
/// When the directory cannot be opened or written.
pub fn insert_record(path: &Path, record: &RawRecord) -> Result<(), StorageError> {
    let ks = open_db(path)?;
    let info = ks.db.keyspace("info", Default::default).map_err(io)?;
    let (i, key, value) = record;
    let k = in_order(&ks, &info)[*i % KEYSPACES.len()];
    k.insert(key.as_slice(), value.as_slice()).map_err(io)?;
    ks.db.persist(fjall::PersistMode::SyncAll).map_err(io)?;
    Ok(())
}
