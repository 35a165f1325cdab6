//! On-disk record formats of the embedded store (format version 3; see [`FORMAT_VERSION`]).
//!
//! Keyspaces and their records:
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `bodies` | the job's enqueue number, [`Meta::body_seq`] (8 bytes, big endian) | [`Body`]: what never changes after enqueue |
//! | `jobs` | job id (16 bytes, big endian) | [`Body`] of a job written by format 1 |
//! | `meta` | job id | [`Meta`]: queue, order, attempt and stage; rewritten on each transition |
//! | `dedup_log` | the enqueue number of the job the record names (8 bytes, big endian) | [`record_key`] and [`DedupRecord`] ([`DedupRecord::encode_logged`]) |
//! | `dedup` | queue, NUL, idempotency key | [`DedupRecord`] written by format 2 or earlier |
//! | `queues` | queue name | [`QueueRecord`] (pause flag) |
//! | `info` | `format_version` | u32, little endian |
//!
//! Every value starts with a version byte. Integers are little endian; strings and byte strings
//! are a u32 length then the bytes; an optional value is a 0/1 byte then the value.

use super::group_commit::Ks;
pub(crate) use crate::domain::Stage;
use crate::domain::{
    DeadLetterCause, Fingerprint, JobContent, JobId, NewJob, Payload, TraceContext, UnixMs, Value,
};
use crate::storage::StorageError;
use std::collections::BTreeMap;

/// The format version this build writes; it reads this one and every earlier one.
///
/// - 1: a body is stored under its job's id.
/// - 2: a new job's body is stored in the `bodies` keyspace under its enqueue number
///   ([`Meta::body_seq`]), so that new bodies arrive in ascending key order and fjall can move
///   their tables down the levels instead of merging them. Bodies written by format 1 stay in
///   `jobs` under their ids (a meta without `body_seq`); a store opened by this build is marked
///   2, which an older build refuses to open. A keyspace of its own, not new keys in `jobs`,
///   so that an upgraded directory's new bodies get this build's options (fjall keeps a
///   keyspace's options from its creation).
/// - 3: a new dedup record is stored in the `dedup_log` keyspace under the enqueue number of the
///   job it names, with its queue and key in the value, so that new records too arrive in
///   ascending key order (the records are looked up in memory, never on disk by key). Records
///   written by format 2 stay in `dedup` under their keys ([`DedupAt::Keyed`]) until they
///   expire, are forgotten or are replaced (as do those of format 1).
pub(crate) const FORMAT_VERSION: u32 = 3;
const RECORD_V1: u8 = 1;

/// A job's immutable part.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Body {
    pub(crate) job_type: String,
    pub(crate) payload: Option<Payload>,
    pub(crate) trace_context: Option<TraceContext>,
    pub(crate) custom: BTreeMap<String, Value>,
    pub(crate) scheduled_at: Option<UnixMs>,
    pub(crate) idempotency_key: Option<String>,
}

impl Body {
    /// What job inspection reports of a body: the job's idempotency key and, `with_content`,
    /// what the job carries.
    pub(crate) fn inspected(self, with_content: bool) -> (Option<String>, Option<JobContent>) {
        let content = with_content.then_some(JobContent {
            payload: self.payload,
            custom: self.custom,
            trace_context: self.trace_context,
        });
        (self.idempotency_key, content)
    }

    /// The encoded body of a new job (what it keeps for its whole life), written from the
    /// job's own fields: nothing is copied before encoding.
    pub(crate) fn encode_of(j: &NewJob) -> Vec<u8> {
        BodyRef {
            job_type: &j.job_type,
            payload: j.payload.as_ref(),
            trace_context: j.trace_context.as_ref(),
            custom: &j.custom,
            scheduled_at: j.scheduled_at,
            idempotency_key: j.dedup.as_ref().map(|d| d.key.as_str()),
        }
        .encode()
    }
}

/// A body's fields, borrowed: what [`Body::encode`] and [`Body::encode_of`] write.
struct BodyRef<'a> {
    job_type: &'a str,
    payload: Option<&'a Payload>,
    trace_context: Option<&'a TraceContext>,
    custom: &'a BTreeMap<String, Value>,
    scheduled_at: Option<UnixMs>,
    idempotency_key: Option<&'a str>,
}

/// A job's mutable part: everything the in-memory index needs, so that recovery reads only
/// these small records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Meta {
    pub(crate) queue: std::sync::Arc<str>,
    /// Kept here too so that a tombstone can still say what the job was. Interned by the
    /// job index, like `queue`.
    pub(crate) job_type: std::sync::Arc<str>,
    pub(crate) priority: u8,
    /// Enqueue order (FIFO within a priority).
    pub(crate) seq: u64,
    pub(crate) enqueued_at: UnixMs,
    /// The number of the last delivery started (0 before the first).
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) stage: Stage,
    pub(crate) worker_id: Option<String>,
    pub(crate) last_reason: Option<String>,
    /// Expiry of the dedup record naming this job, if it was keyed.
    pub(crate) dedup_until: Option<UnixMs>,
    /// The job's size in a Reserve reply, at most ([`crate::domain::NewJob::reply_bytes`]); 0 when
    /// unknown (a record written before this field existed: such a job is sent alone). Stored after `dedup_until`; a record that
    /// ends before it is such an older record.
    pub(crate) reply_bytes: u32,
    /// Where the job's body is stored ([`BodyKey`]): in `bodies` under this number, the job's
    /// `seq` when it was enqueued (a job requeued from the dead letters gets a new `seq` but
    /// keeps its body where it is), or, when `None`, in `jobs` under the job's id (a job
    /// written by format 1). Stored after `reply_bytes`, only when set.
    pub(crate) body_seq: Option<u64>,
}

/// Where a job's body is: its keyspace and key there ([`Meta::body_seq`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyKey {
    buf: [u8; 16],
    len: u8,
}

impl BodyKey {
    pub(crate) fn of(id: JobId, meta: &Meta) -> Self {
        match meta.body_seq {
            Some(seq) => {
                let mut buf = [0u8; 16];
                buf[..8].copy_from_slice(&seq.to_be_bytes());
                BodyKey { buf, len: 8 }
            }
            None => BodyKey {
                buf: id.to_bytes(),
                len: 16,
            },
        }
    }

    /// The keyspace the body is in: `bodies` for an enqueue number, `jobs` for a format-1 id.
    pub(crate) fn ks(&self) -> Ks {
        if self.len == 8 { Ks::Bodies } else { Ks::Jobs }
    }
}

impl AsRef<[u8]> for BodyKey {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl From<BodyKey> for Vec<u8> {
    fn from(k: BodyKey) -> Vec<u8> {
        k.as_ref().to_vec()
    }
}

/// The value of a dedup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DedupRecord {
    pub(crate) job_id: JobId,
    pub(crate) created_at: UnixMs,
    pub(crate) expires_at: UnixMs,
    /// Written only when set (8 more bytes); a record without it decodes as before.
    pub(crate) fingerprint: Option<Fingerprint>,
}

/// Per-queue state that must survive restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct QueueRecord {
    pub(crate) paused: bool,
}

/// The key of a dedup record: in the in-memory index, in the `dedup` keyspace (format 2 and
/// earlier), and in the value of a `dedup_log` record (format 3): the queue name, a NUL byte,
/// then the idempotency key's bytes. Queue names cannot contain control characters, so the NUL
/// separates the two unambiguously and the same key on two queues never collides; keys are
/// compared byte for byte (no trimming, case folding or Unicode normalisation).
pub(crate) fn record_key(queue: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(queue.len() + 1 + key.len());
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The queue of a [`record_key`] (the key's bytes are not looked at).
pub(crate) fn record_queue(k: &[u8]) -> Option<&str> {
    let nul = k.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&k[..nul]).ok()
}

/// Splits a [`record_key`] back into queue and key.
pub(crate) fn split_record_key(k: &[u8]) -> Option<(&str, &str)> {
    let nul = k.iter().position(|b| *b == 0)?;
    let queue = std::str::from_utf8(&k[..nul]).ok()?;
    let key = std::str::from_utf8(&k[nul + 1..]).ok()?;
    Some((queue, key))
}

struct W(Vec<u8>);

impl W {
    fn new(cap: usize) -> Self {
        let mut v = Vec::with_capacity(cap);
        v.push(RECORD_V1);
        W(v)
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
    fn opt_i64(&mut self, v: Option<i64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.i64(v);
            }
            None => self.u8(0),
        }
    }
}

struct R<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> R<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Result<Self, StorageError> {
        let mut r = R { buf, what };
        let v = r.u8()?;
        if v != RECORD_V1 {
            return Err(r.err(format!("unknown record version {v}")));
        }
        Ok(r)
    }
    fn err(&self, detail: String) -> StorageError {
        StorageError::Corrupt {
            what: self.what,
            detail,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        if self.buf.len() < n {
            return Err(self.err("truncated".into()));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, StorageError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, StorageError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self) -> Result<i64, StorageError> {
        Ok(self.u64()? as i64)
    }
    fn bytes(&mut self) -> Result<&'a [u8], StorageError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, StorageError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("invalid utf-8".into()))
    }
    fn opt_string(&mut self) -> Result<Option<String>, StorageError> {
        Ok(if self.u8()? == 1 {
            Some(self.string()?)
        } else {
            None
        })
    }
    fn opt_i64(&mut self) -> Result<Option<i64>, StorageError> {
        Ok(if self.u8()? == 1 {
            Some(self.i64()?)
        } else {
            None
        })
    }
}

fn cause_to_u8(c: DeadLetterCause) -> u8 {
    match c {
        DeadLetterCause::AttemptsExhausted => 1,
        DeadLetterCause::Rejected => 2,
        DeadLetterCause::LeaseExpired => 3,
        DeadLetterCause::Admin => 4,
    }
}

fn cause_from_u8(v: u8) -> Option<DeadLetterCause> {
    Some(match v {
        1 => DeadLetterCause::AttemptsExhausted,
        2 => DeadLetterCause::Rejected,
        3 => DeadLetterCause::LeaseExpired,
        4 => DeadLetterCause::Admin,
        _ => return None,
    })
}

impl BodyRef<'_> {
    fn encode(&self) -> Vec<u8> {
        let payload_len = self
            .payload
            .as_ref()
            .map_or(0, |p| p.data.len() + p.encoding.len());
        let mut w = W::new(64 + self.job_type.len() + payload_len);
        w.str(self.job_type);
        match self.payload {
            Some(p) => {
                w.u8(1);
                w.bytes(&p.data);
                w.str(&p.encoding);
            }
            None => w.u8(0),
        }
        match self.trace_context {
            Some(t) => {
                w.u8(1);
                w.str(&t.traceparent);
                w.opt_str(t.tracestate.as_deref());
            }
            None => w.u8(0),
        }
        w.u32(self.custom.len() as u32);
        for (k, v) in self.custom {
            w.str(k);
            match v {
                Value::String(s) => {
                    w.u8(1);
                    w.str(s);
                }
                Value::Double(d) => {
                    w.u8(2);
                    w.u64(d.to_bits());
                }
                Value::Int(i) => {
                    w.u8(3);
                    w.i64(*i);
                }
                Value::Bool(b) => {
                    w.u8(4);
                    w.u8(u8::from(*b));
                }
            }
        }
        w.opt_i64(self.scheduled_at);
        w.opt_str(self.idempotency_key);
        w.0
    }
}

impl Body {
    pub(crate) fn encode(&self) -> Vec<u8> {
        BodyRef {
            job_type: &self.job_type,
            payload: self.payload.as_ref(),
            trace_context: self.trace_context.as_ref(),
            custom: &self.custom,
            scheduled_at: self.scheduled_at,
            idempotency_key: self.idempotency_key.as_deref(),
        }
        .encode()
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Self, StorageError> {
        let mut r = R::new(buf, "job body")?;
        let job_type = r.string()?;
        let payload = if r.u8()? == 1 {
            let data = r.bytes()?.to_vec();
            let encoding = r.string()?;
            Some(Payload { data, encoding })
        } else {
            None
        };
        let trace_context = if r.u8()? == 1 {
            let traceparent = r.string()?;
            let tracestate = r.opt_string()?;
            Some(TraceContext {
                traceparent,
                tracestate,
            })
        } else {
            None
        };
        let n = r.u32()?;
        let mut custom = BTreeMap::new();
        for _ in 0..n {
            let k = r.string()?;
            let v = match r.u8()? {
                1 => Value::String(r.string()?),
                2 => Value::Double(f64::from_bits(r.u64()?)),
                3 => Value::Int(r.i64()?),
                4 => Value::Bool(r.u8()? != 0),
                t => return Err(r.err(format!("unknown custom value tag {t}"))),
            };
            custom.insert(k, v);
        }
        let scheduled_at = r.opt_i64()?;
        let idempotency_key = r.opt_string()?;
        Ok(Body {
            job_type,
            payload,
            trace_context,
            custom,
            scheduled_at,
            idempotency_key,
        })
    }
}

impl Meta {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = W::new(64 + self.queue.len() + self.job_type.len());
        w.str(&self.queue);
        w.str(&self.job_type);
        w.u8(self.priority);
        w.u64(self.seq);
        w.i64(self.enqueued_at);
        w.u32(self.attempt);
        w.u32(self.max_attempts);
        match self.stage {
            Stage::Ready => w.u8(1),
            Stage::Scheduled { due } => {
                w.u8(2);
                w.i64(due);
            }
            Stage::InFlight { expires } => {
                w.u8(3);
                w.i64(expires);
            }
            Stage::Dead { cause, failed_at } => {
                w.u8(4);
                w.u8(cause_to_u8(cause));
                w.i64(failed_at);
            }
            Stage::Tombstone {
                finished_at,
                until,
                dead,
            } => {
                w.u8(5);
                w.i64(finished_at);
                w.i64(until);
                w.u8(dead.map_or(0, cause_to_u8));
            }
        }
        w.opt_str(self.worker_id.as_deref());
        w.opt_str(self.last_reason.as_deref());
        w.opt_i64(self.dedup_until);
        w.u32(self.reply_bytes);
        if let Some(seq) = self.body_seq {
            w.u64(seq);
        }
        w.0
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Self, StorageError> {
        let mut r = R::new(buf, "job meta")?;
        let queue: std::sync::Arc<str> = r.string()?.into();
        let job_type: std::sync::Arc<str> = r.string()?.into();
        let priority = r.u8()?;
        let seq = r.u64()?;
        let enqueued_at = r.i64()?;
        let attempt = r.u32()?;
        let max_attempts = r.u32()?;
        let stage = match r.u8()? {
            1 => Stage::Ready,
            2 => Stage::Scheduled { due: r.i64()? },
            3 => Stage::InFlight { expires: r.i64()? },
            4 => {
                let c = r.u8()?;
                let cause = cause_from_u8(c).ok_or_else(|| r.err(format!("unknown cause {c}")))?;
                Stage::Dead {
                    cause,
                    failed_at: r.i64()?,
                }
            }
            5 => {
                let finished_at = r.i64()?;
                let until = r.i64()?;
                let dead = cause_from_u8(r.u8()?);
                Stage::Tombstone {
                    finished_at,
                    until,
                    dead,
                }
            }
            t => return Err(r.err(format!("unknown stage {t}"))),
        };
        let worker_id = r.opt_string()?;
        let last_reason = r.opt_string()?;
        let dedup_until = r.opt_i64()?;
        let reply_bytes = if r.buf.is_empty() { 0 } else { r.u32()? };
        let body_seq = if r.buf.is_empty() {
            None
        } else {
            Some(r.u64()?)
        };
        Ok(Meta {
            queue,
            job_type,
            priority,
            seq,
            enqueued_at,
            attempt,
            max_attempts,
            stage,
            worker_id,
            last_reason,
            dedup_until,
            reply_bytes,
            body_seq,
        })
    }
}

impl DedupRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = W::new(41);
        self.put(&mut w);
        w.0
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Self, StorageError> {
        Self::read(&mut R::new(buf, "dedup record")?)
    }

    /// A dedup record of the `dedup_log` keyspace: its [`record_key`], then the record; stored
    /// under the enqueue number of the job it names ([`DedupAt::Log`]).
    pub(crate) fn encode_logged(&self, key: &[u8]) -> Vec<u8> {
        let mut w = W::new(45 + key.len());
        w.bytes(key);
        self.put(&mut w);
        w.0
    }

    /// The record key and the record of an [`DedupRecord::encode_logged`] value.
    pub(crate) fn decode_logged(buf: &[u8]) -> Result<(&[u8], Self), StorageError> {
        let mut r = R::new(buf, "dedup log record")?;
        let key = r.bytes()?;
        Ok((key, Self::read(&mut r)?))
    }

    /// The record's fields, the fingerprint last and only when set (a record without it is as
    /// records were before fingerprints).
    fn put(&self, w: &mut W) {
        w.0.extend_from_slice(&self.job_id.to_bytes());
        w.i64(self.created_at);
        w.i64(self.expires_at);
        if let Some(f) = self.fingerprint {
            w.u64(f.get());
        }
    }

    /// Reads what [`DedupRecord::put`] wrote, to the end of the value.
    fn read(r: &mut R<'_>) -> Result<Self, StorageError> {
        let mut id = [0u8; 16];
        id.copy_from_slice(r.take(16)?);
        let created_at = r.i64()?;
        let expires_at = r.i64()?;
        let fingerprint = if r.buf.is_empty() {
            None
        } else {
            Fingerprint::new(r.u64()?)
        };
        if !r.buf.is_empty() {
            return Err(r.err(format!("{} bytes after the record", r.buf.len())));
        }
        Ok(DedupRecord {
            job_id: JobId::from_bytes(id),
            created_at,
            expires_at,
            fingerprint,
        })
    }
}

/// Where a dedup record is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum DedupAt {
    /// In `dedup_log`, under this number (8 bytes, big endian): the enqueue number of the job
    /// the record names. Written by format 3.
    Log(u64),
    /// In `dedup` under its [`record_key`]: written by format 2 or earlier.
    Keyed,
}

impl DedupAt {
    /// The delete of the record at this place; `key` is its record key.
    pub(crate) fn delete(self, key: &[u8]) -> super::group_commit::WriteOp {
        match self {
            DedupAt::Log(n) => {
                super::group_commit::WriteOp::delete(Ks::DedupLog, n.to_be_bytes().to_vec())
            }
            DedupAt::Keyed => super::group_commit::WriteOp::delete(Ks::Dedup, key.to_vec()),
        }
    }
}

impl QueueRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = W::new(2);
        w.u8(u8::from(self.paused));
        w.0
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Self, StorageError> {
        let mut r = R::new(buf, "queue record")?;
        Ok(QueueRecord {
            paused: r.u8()? != 0,
        })
    }
}

/// Decodes an 8-byte enqueue number key (the keys of `dedup_log`; `bodies` has the same form).
pub(crate) fn decode_seq(key: &[u8]) -> Result<u64, StorageError> {
    let arr: [u8; 8] = key.try_into().map_err(|_| StorageError::Corrupt {
        what: "enqueue number key",
        detail: format!("{} bytes", key.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

/// Decodes a 16-byte job id key.
pub(crate) fn decode_id(key: &[u8]) -> Result<JobId, StorageError> {
    let arr: [u8; 16] = key.try_into().map_err(|_| StorageError::Corrupt {
        what: "job key",
        detail: format!("{} bytes, expected 16", key.len()),
    })?;
    Ok(JobId::from_bytes(arr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_compared_byte_for_byte() {
        let nfc = "\u{e9}";
        let nfd = "e\u{301}";
        let keys = ["abc", "ABC", " abc", nfc, nfd];
        let mut records: Vec<Vec<u8>> = keys.iter().map(|k| record_key("q", k)).collect();
        records.sort();
        records.dedup();
        assert_eq!(records.len(), 5);
    }

    #[test]
    fn the_same_key_on_two_queues_is_two_records() {
        assert_ne!(record_key("a", "k"), record_key("b", "k"));
        assert_eq!(
            split_record_key(&record_key("a", "k\0x")),
            Some(("a", "k\0x"))
        );
    }

    #[test]
    fn records_round_trip() {
        let mut custom = BTreeMap::new();
        custom.insert("s".to_string(), Value::String("x".into()));
        custom.insert("d".to_string(), Value::Double(1.5));
        custom.insert("i".to_string(), Value::Int(-3));
        custom.insert("b".to_string(), Value::Bool(true));
        let body = Body {
            job_type: "t".into(),
            payload: Some(Payload {
                data: vec![0, 1, 2],
                encoding: "application/octet-stream".into(),
            }),
            trace_context: Some(TraceContext {
                traceparent: "00-abc-def-01".into(),
                tracestate: None,
            }),
            custom,
            scheduled_at: Some(42),
            idempotency_key: Some("k".into()),
        };
        assert_eq!(Body::decode(&body.encode()).unwrap(), body);
        let job = NewJob {
            job_type: body.job_type.clone(),
            payload: body.payload.clone(),
            trace_context: body.trace_context.clone(),
            custom: body.custom.clone(),
            scheduled_at: body.scheduled_at,
            id: JobId(7),
            queue: "q".into(),
            priority: 0,
            max_attempts: 1,
            enqueued_at: 0,
            dedup: Some(crate::domain::DedupClaim {
                key: "k".into(),
                expires_at: 100,
                fingerprint: None,
                replace: None,
            }),
            max_queue_depth: None,
            reply_bytes: 1,
        };
        assert_eq!(Body::encode_of(&job), body.encode(), "a new job's body");
        for stage in [
            Stage::Ready,
            Stage::Scheduled { due: 5 },
            Stage::InFlight { expires: 6 },
            Stage::Dead {
                cause: DeadLetterCause::LeaseExpired,
                failed_at: 7,
            },
            Stage::Tombstone {
                finished_at: 8,
                until: 9,
                dead: None,
            },
        ] {
            let meta = Meta {
                queue: "q".into(),
                job_type: "t".into(),
                priority: 9,
                seq: 77,
                enqueued_at: 1,
                attempt: 2,
                max_attempts: 3,
                stage,
                worker_id: Some("w".into()),
                last_reason: None,
                dedup_until: Some(10),
                reply_bytes: 1234,
                body_seq: Some(70),
            };
            assert_eq!(Meta::decode(&meta.encode()).unwrap(), meta);
            let format_1 = Meta {
                body_seq: None,
                ..meta
            };
            assert_eq!(Meta::decode(&format_1.encode()).unwrap(), format_1);
        }
        let mut d = DedupRecord {
            job_id: JobId(99),
            created_at: 1,
            expires_at: 2,
            fingerprint: None,
        };
        assert_eq!(
            d.encode().len(),
            33,
            "a record without a fingerprint is as before"
        );
        assert_eq!(DedupRecord::decode(&d.encode()).unwrap(), d);
        let key = record_key("q", "k\0x");
        for fingerprint in [None, Fingerprint::new(0xfeed)] {
            d.fingerprint = fingerprint;
            assert_eq!(DedupRecord::decode(&d.encode()).unwrap(), d);
            let logged = d.encode_logged(&key);
            assert_eq!(
                DedupRecord::decode_logged(&logged).unwrap(),
                (key.as_slice(), d)
            );
            // Cut anywhere, it is refused, not misread, except just before the optional
            // fingerprint, where it is a whole record without one; a longer value is refused.
            let without = logged.len() - if fingerprint.is_some() { 8 } else { 0 };
            for cut in (0..logged.len()).filter(|c| *c != without) {
                assert!(
                    DedupRecord::decode_logged(&logged[..cut]).is_err(),
                    "cut at {cut}"
                );
            }
            let mut longer = logged.clone();
            longer.extend_from_slice(&[0; 9]);
            assert!(DedupRecord::decode_logged(&longer).is_err());
        }
        assert_eq!(decode_seq(&7u64.to_be_bytes()).unwrap(), 7);
        assert!(decode_seq(&[0; 16]).is_err());
    }

    /// A ready job's meta with the two trailing fields given.
    fn ready_meta(reply_bytes: u32, body_seq: Option<u64>) -> Meta {
        Meta {
            queue: "q".into(),
            job_type: "t".into(),
            priority: 0,
            seq: 9,
            enqueued_at: 0,
            attempt: 0,
            max_attempts: 1,
            stage: Stage::Ready,
            worker_id: None,
            last_reason: None,
            dedup_until: None,
            reply_bytes,
            body_seq,
        }
    }

    #[test]
    fn truncated_records_are_reported_not_panicked_on() {
        let meta = ready_meta(99, Some(7));
        let bytes = meta.encode();
        // A record that ends right before `body_seq` is one of format 1 (its body keyed by
        // id), and one that ends right before `reply_bytes` one written before that field.
        let format_1 = bytes.len() - 8;
        let older = format_1 - 4;
        for n in (0..bytes.len()).filter(|n| *n != older && *n != format_1) {
            assert!(Meta::decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        let m = Meta::decode(&bytes[..format_1]).unwrap();
        assert_eq!((m.reply_bytes, m.body_seq), (99, None));
        let m = Meta::decode(&bytes[..older]).unwrap();
        assert_eq!((m.reply_bytes, m.body_seq), (0, None));
        assert_eq!(m.stage, Stage::Ready);
        assert_eq!(Meta::decode(&bytes).unwrap(), meta);
    }

    #[test]
    fn a_body_is_keyed_by_its_enqueue_number_or_by_its_id_in_format_1() {
        let id = JobId(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let mut meta = ready_meta(0, Some(0x0102));
        assert_eq!(BodyKey::of(id, &meta).as_ref(), &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(BodyKey::of(id, &meta).ks(), Ks::Bodies);
        meta.body_seq = None;
        assert_eq!(BodyKey::of(id, &meta).as_ref(), &id.to_bytes()[..]);
        assert_eq!(BodyKey::of(id, &meta).ks(), Ks::Jobs);
        assert_eq!(Vec::from(BodyKey::of(id, &meta)), id.to_bytes().to_vec());
    }
}
