#!/usr/bin/env node
// One benchmark point against a peer job queue (BullMQ, NATS JetStream or pg-boss), with the
// peer's native Node client, mirroring sepp-bench's workloads. Prints ONE JSON object on
// stdout; diagnostics go to stderr. See README.md.
//
//   node peer.mjs --system bullmq|nats|pgboss --url URL --workload nokey|unique|hits|drain|cycle
//     --connections N --duration SECS --warmup SECS [--payload-bytes 256] [--hit-keys 1000]
//     [--drain-jobs N] [--server-pid PID]... [--label TEXT]
//     [--pg-synchronous-commit on|off] [--pg-options=TEXT] [--pgboss-dedup policy|seconds|none]
//     [--shared-connection]   (BullMQ nokey/unique/hits: N concurrent adds on ONE autopipelined
//                              ioredis connection instead of N connections)

import { parseArgs } from 'node:util';
import { readFileSync, readdirSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { randomBytes } from 'node:crypto';

const require = createRequire(import.meta.url);
const log = (...a) => console.error('[peer]', ...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => performance.now();

// ---------------------------------------------------------------- arguments

const { values: A } = parseArgs({
  options: {
    system: { type: 'string' },
    url: { type: 'string' },
    workload: { type: 'string' },
    connections: { type: 'string', default: '32' },
    duration: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '1' },
    'payload-bytes': { type: 'string', default: '256' },
    'hit-keys': { type: 'string', default: '1000' },
    'drain-jobs': { type: 'string' },
    'server-pid': { type: 'string', multiple: true, default: [] },
    label: { type: 'string' },
    'pg-options': { type: 'string' },
    'pg-synchronous-commit': { type: 'string' },
    'pgboss-dedup': { type: 'string', default: 'policy' },
    'shared-connection': { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h' },
  },
  strict: true,
});

if (A.help) {
  console.error(readFileSync(new URL(import.meta.url)).toString().split('\n').slice(1, 11).join('\n'));
  process.exit(0);
}

const SYSTEMS = ['bullmq', 'nats', 'pgboss'];
const WORKLOADS = ['nokey', 'unique', 'hits', 'drain', 'cycle'];
function die(msg) {
  console.error(`peer.mjs: ${msg}`);
  process.exit(2);
}
if (!SYSTEMS.includes(A.system)) die(`--system must be one of ${SYSTEMS.join(', ')}`);
if (!WORKLOADS.includes(A.workload)) die(`--workload must be one of ${WORKLOADS.join(', ')}`);
if (!A.url) die('--url is required');
const num = (name, v, { int = false, min = 0 } = {}) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n < min || (int && !Number.isInteger(n))) die(`bad --${name}: ${v}`);
  return n;
};
const CONNS = A.workload === 'cycle' ? 1 : num('connections', A.connections, { int: true, min: 1 });
const DURATION = num('duration', A.duration, { min: 0.05 });
const WARMUP = num('warmup', A.warmup);
const PAYLOAD_BYTES = num('payload-bytes', A['payload-bytes'], { int: true, min: 1 });
const HIT_KEYS = num('hit-keys', A['hit-keys'], { int: true, min: 1 });
const DRAIN_JOBS = A['drain-jobs'] ? num('drain-jobs', A['drain-jobs'], { int: true, min: 1 }) : 20000;
const SERVER_PIDS = A['server-pid'].map((p) => num('server-pid', p, { int: true, min: 1 }));
if (!['policy', 'seconds', 'none'].includes(A['pgboss-dedup'])) die('--pgboss-dedup must be policy, seconds or none');
const SHARED = A['shared-connection'];
if (SHARED && A.system !== 'bullmq') die('--shared-connection is implemented for --system bullmq only');
if (SHARED && !['nokey', 'unique', 'hits'].includes(A.workload)) die('--shared-connection applies to nokey, unique and hits only');

const RUN_ID = `${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
// Stream / queue names: letters, digits, '_' and '-' only (valid for all three systems).
const POINT = `sb_${RUN_ID}_${A.workload}_c${CONNS}`;
const MAX_FAILS_IN_A_ROW = 200;

// The payload: PAYLOAD_BYTES bytes. BullMQ and pg-boss take JSON, so they get {p: <string of
// PAYLOAD_BYTES ASCII chars>}; NATS gets the raw bytes. The first char marks who wrote it
// ('o' = hit-key prefill, 'h' = a hits call, 'x' = anything else) so BullMQ hits can be checked.
const payloadStr = (mark) => mark + 'x'.repeat(PAYLOAD_BYTES - 1);
const PAYLOAD_BYTES_BUF = Buffer.from(payloadStr('x'));

// ---------------------------------------------------------------- watchdog

// A point never runs forever: hard exit well after the longest legitimate run.
const hardLimitS = WARMUP + (A.workload === 'drain' ? 3 * DURATION + 2 : DURATION) + 180;
setTimeout(() => {
  console.error(`peer.mjs: hard time limit of ${hardLimitS.toFixed(0)} s reached, exiting`);
  process.exit(3);
}, hardLimitS * 1000).unref();

// ---------------------------------------------------------------- /proc sampling

let CLK_TCK = 100;
try {
  CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;
} catch {}

function readStat(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    // f[0] = field 3 (state); ppid = field 4; utime = 14; stime = 15.
    return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]) };
  } catch {
    return null;
  }
}

/** pid -> {ppid, ticks} for every process of the machine. */
function allProcs() {
  const m = new Map();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const st = readStat(d);
    if (st) m.set(Number(d), st);
  }
  return m;
}

/** The given pids and all their descendants, minus `exclude`. pid -> ticks. */
function tree(roots, exclude = new Set()) {
  const procs = allProcs();
  const children = new Map();
  for (const [pid, { ppid }] of procs) {
    if (!children.has(ppid)) children.set(ppid, []);
    children.get(ppid).push(pid);
  }
  const out = new Map();
  const stack = roots.filter((p) => procs.has(p));
  while (stack.length) {
    const p = stack.pop();
    if (out.has(p)) continue;
    if (!exclude.has(p)) out.set(p, procs.get(p).ticks);
    for (const c of children.get(p) || []) stack.push(c);
  }
  return out;
}

function rssKiB(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Busy CPU seconds of the whole machine (all cores) and IO-pressure stall microseconds. */
function machineCounters() {
  let busy = null;
  let ioSomeUs = null;
  try {
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    busy = (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] || 0)) / CLK_TCK;
  } catch {}
  try {
    ioSomeUs = Number(/some .*total=(\d+)/.exec(readFileSync('/proc/pressure/io', 'utf8'))[1]);
  } catch {}
  return { busy, ioSomeUs, wall: nowMs() / 1000 };
}

function pssKiB(pid) {
  try {
    const m = /\nPss:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/**
 * Server CPU and peak RSS over a window. `excludeFn` returns pids of the tree that are not
 * ours (other clients' PostgreSQL backends on the shared postmaster).
 */
class ServerMonitor {
  constructor(pids, excludeFn) {
    this.pids = pids;
    this.excludeFn = excludeFn || (async () => new Set());
    this.enabled = pids.length > 0;
  }
  async start() {
    this.m0 = machineCounters();
    if (!this.enabled) return;
    this.exclude = await this.excludeFn();
    this.t0 = tree(this.pids, this.exclude);
    this.members = [...this.t0.keys()];
    this.peakKiB = 0;
    this.peakPssKiB = 0;
    this.samples = 0;
    this.sample(true);
    let n = 0;
    this.timer = setInterval(() => {
      // Refresh the member list once a second (new backends / workers).
      if (++n % 10 === 0) this.members = [...tree(this.pids, this.exclude).keys()];
      // PSS (shared pages split between the processes that map them) costs a page-table
      // walk, so only every 500 ms.
      this.sample(n % 5 === 0);
    }, 100);
  }
  sample(withPss = false) {
    let kib = 0;
    for (const p of this.members) kib += rssKiB(p);
    this.samples++;
    if (kib > this.peakKiB) this.peakKiB = kib;
    if (withPss) {
      let pss = 0;
      for (const p of this.members) pss += pssKiB(p);
      if (pss > this.peakPssKiB) this.peakPssKiB = pss;
    }
  }
  async stop() {
    const m1 = machineCounters();
    const machine = {
      wall_s: m1.wall - this.m0.wall,
      busy_s: m1.busy != null && this.m0.busy != null ? m1.busy - this.m0.busy : null,
      io_some_pct: m1.ioSomeUs != null && this.m0.ioSomeUs != null ? (m1.ioSomeUs - this.m0.ioSomeUs) / 1e4 / (m1.wall - this.m0.wall) : null,
    };
    if (!this.enabled) return { cpu_s: null, peak_rss_mib: null, peak_pss_mib: null, machine };
    clearInterval(this.timer);
    this.sample(true);
    const exclude = new Set([...this.exclude, ...(await this.excludeFn())]);
    const t1 = tree(this.pids, exclude);
    let ticks = 0;
    let lost = 0;
    for (const [pid, t] of t1) ticks += t - (this.t0.get(pid) ?? 0);
    for (const pid of this.t0.keys()) if (!t1.has(pid)) lost++;
    return {
      cpu_s: ticks / CLK_TCK,
      peak_rss_mib: this.peakKiB / 1024,
      peak_pss_mib: this.peakPssKiB / 1024,
      processes: t1.size,
      processes_gone: lost,
      rss_samples: this.samples,
      machine,
    };
  }
}

// ---------------------------------------------------------------- statistics

class Stats {
  constructor() {
    this.lat = [];
    this.jobs = 0;
    this.errors = 0;
    this.anomalies = 0;
    this.messages = new Map();
  }
  note(msg, anomaly = false) {
    const k = (anomaly ? 'anomaly: ' : '') + String(msg).slice(0, 300);
    this.messages.set(k, (this.messages.get(k) || 0) + 1);
  }
  error(e) {
    this.errors++;
    this.note(e?.message || e?.code || String(e));
  }
  anomaly(msg) {
    this.anomalies++;
    this.note(msg, true);
  }
  latency() {
    const a = Float64Array.from(this.lat).sort();
    const n = a.length;
    if (!n) return { count: 0, mean: null, p50: null, p90: null, p99: null, p999: null, max: null };
    const q = (p) => a[Math.min(n - 1, Math.max(0, Math.ceil(p * n) - 1))];
    let sum = 0;
    for (const v of a) sum += v;
    const r = (v) => Math.round(v * 1000) / 1000;
    return { count: n, mean: r(sum / n), p50: r(q(0.5)), p90: r(q(0.9)), p99: r(q(0.99)), p999: r(q(0.999)), max: r(a[n - 1]) };
  }
}

const pkgVersion = (name) => {
  try {
    return require(`${name}/package.json`).version;
  } catch {
    // Packages whose "exports" hide package.json.
    try {
      return JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
    } catch {
      return null;
    }
  }
};

// ---------------------------------------------------------------- BullMQ

async function bullmqAdapter(url) {
  const { Queue, Worker } = await import('bullmq');
  const { default: IORedis } = await import('ioredis');
  const u = new URL(url);
  const conn = { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
  const admin = new IORedis(conn);
  const info = await admin.info('server');
  const redisVersion = /redis_version:(\S+)/.exec(info)?.[1];
  const persistence = await admin.info('persistence');
  const aof = /aof_enabled:(\d)/.exec(persistence)?.[1] === '1';
  const [, fsync] = await admin.config('GET', 'appendfsync');
  const adminQueue = new Queue(POINT, { connection: conn });

  const a = {
    versions: { bullmq: pkgVersion('bullmq'), ioredis: pkgVersion('ioredis'), server: `redis ${redisVersion}` },
    notes: [
      `Redis ${redisVersion}: appendonly ${aof ? 'yes' : 'no'}${aof ? `, appendfsync ${fsync}` : ''}`,
      'BullMQ default job options (completed jobs kept in the completed set; no removeOnComplete)',
    ],
    async open() {
      const q = new Queue(POINT, { connection: conn });
      await q.waitUntilReady();
      return q;
    },
    async close(q) {
      await q.close();
    },
    // --shared-connection: ONE Queue on ONE ioredis connection with enableAutoPipelining, so
    // the adds that N concurrent loops issue in the same event-loop tick leave as one pipeline
    // (one write to the socket; Redis runs them and, with appendfsync always, fsyncs once
    // before answering them all): BullMQ's own form of coalescing.
    async openShared() {
      const redis = new IORedis({ ...conn, enableAutoPipelining: true });
      const q = new Queue(POINT, { connection: redis });
      await q.waitUntilReady();
      a.notes.push('shared connection: one Queue on one ioredis connection with enableAutoPipelining: true; every loop calls add on it');
      return { q, redis };
    },
    async closeShared({ q, redis }) {
      await q.close();
      await redis.quit();
    },
    async enqueue(q, key, mark) {
      await q.add('j', { p: payloadStr(mark) }, key ? { jobId: key } : undefined);
      return null; // BullMQ does not tell the producer whether the jobId existed
    },
    async prefillKeys(keys) {
      for (let i = 0; i < keys.length; i += 500) {
        await adminQueue.addBulk(keys.slice(i, i + 500).map((k) => ({ name: 'j', data: { p: payloadStr('o') }, opts: { jobId: k } })));
      }
    },
    async fill(n) {
      for (let i = 0; i < n; i += 1000) {
        const m = Math.min(1000, n - i);
        await adminQueue.addBulk(Array.from({ length: m }, () => ({ name: 'j', data: { p: payloadStr('x') } })));
      }
      const c = await adminQueue.getJobCounts('waiting');
      return c.waiting;
    },
    async countJobs() {
      const c = await adminQueue.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'completed', 'failed');
      return Object.values(c).reduce((x, y) => x + y, 0);
    },
    async afterHits(stats, keys) {
      // Every prefilled job must still hold its original data ('o'): a repeated jobId must
      // neither create a job (checked by the caller) nor overwrite one.
      let changed = 0;
      let missing = 0;
      for (let i = 0; i < keys.length; i += 200) {
        const jobs = await Promise.all(keys.slice(i, i + 200).map((k) => adminQueue.getJob(k)));
        for (const j of jobs) {
          if (!j) missing++;
          else if (j.data?.p?.[0] !== 'o') changed++;
        }
      }
      a.notes.push(`hits read-back: ${changed} of ${keys.length} prefilled jobs overwritten, ${missing} missing`);
      for (let i = 0; i < changed; i++) stats.anomaly('a repeated jobId overwrote the stored job');
      for (let i = 0; i < missing; i++) stats.anomaly('a prefilled job is missing');
    },
    async openWorkers(workers, stats) {
      // N Workers, concurrency 1, each with its own connections (BullMQ gives every Worker
      // a normal and a blocking connection). Moving a job to completed also fetches the next.
      const ws = [];
      for (let i = 0; i < workers; i++) {
        const w = new Worker(POINT, async () => 'ok', { connection: conn, concurrency: 1, autorun: false });
        w.on('error', (e) => stats.error(e));
        w.on('failed', (_j, e) => stats.error(e));
        ws.push(w);
      }
      await Promise.all(ws.map((w) => w.waitUntilReady()));
      return ws;
    },
    async closeWorkers(ws) {
      await Promise.all(ws.map((w) => w.close(true).catch(() => {})));
    },
    async drain(ws, n, deadlineMs, stats) {
      let done = 0;
      let tEnd = null;
      let resolveDone;
      const allDone = new Promise((r) => (resolveDone = r));
      const t0 = nowMs();
      for (const w of ws) {
        let last = t0;
        w.on('completed', () => {
          const t = nowMs();
          stats.lat.push(t - last);
          last = t;
          if (++done === n) {
            tEnd = t;
            resolveDone();
          }
        });
        w.run().catch((e) => stats.error(e));
      }
      const timeout = sleep(Math.max(0, deadlineMs - Date.now())).then(() => 'timeout');
      const r = await Promise.race([allDone.then(() => 'done'), timeout]);
      return { done, t0, tEnd: tEnd ?? nowMs(), timedOut: r === 'timeout' };
    },
    async openCycle() {
      const q = await this.open();
      const w = new Worker(POINT, null, { connection: conn, autorun: false });
      await w.waitUntilReady();
      return { q, w, token: `t-${RUN_ID}` };
    },
    async closeCycle(c) {
      await c.w.close(true);
      await c.q.close();
    },
    async cycle(c, stats) {
      const job = await c.q.add('j', { p: payloadStr('x') });
      const got = await c.w.getNextJob(c.token);
      if (!got) throw new Error('getNextJob returned no job');
      if (got.id !== job.id) stats.anomaly('reserved a different job than the one just enqueued');
      await got.moveToCompleted('ok', c.token, false);
    },
    async cleanup() {
      await adminQueue.obliterate({ force: true });
    },
    async shutdown() {
      await adminQueue.close();
      await admin.quit();
    },
  };
  return a;
}

// ---------------------------------------------------------------- NATS JetStream

async function natsAdapter(url) {
  const { connect, nanos } = await import('@nats-io/transport-node');
  const { jetstream, jetstreamManager, AckPolicy, StorageType, RetentionPolicy } = await import('@nats-io/jetstream');
  const servers = url.replace(/^nats:\/\//, '');
  const subj = `${POINT}.jobs`;
  const durable = 'workers';
  const adminNc = await connect({ servers });
  const jsm = await jetstreamManager(adminNc);
  const adminJs = jetstream(adminNc);
  const serverVersion = adminNc.info?.version;
  const acct = await jsm.getAccountInfo();
  await jsm.streams.add({
    name: POINT,
    subjects: [subj],
    storage: StorageType.File,
    num_replicas: 1,
    retention: RetentionPolicy.Workqueue,
    duplicate_window: nanos(120_000),
  });
  await jsm.consumers.add(POINT, { durable_name: durable, ack_policy: AckPolicy.Explicit, ack_wait: nanos(30_000) });

  const a = {
    versions: {
      '@nats-io/transport-node': pkgVersion('@nats-io/transport-node'),
      '@nats-io/jetstream': pkgVersion('@nats-io/jetstream'),
      server: `nats-server ${serverVersion}`,
    },
    notes: [
      `JetStream file storage, 1 replica, work-queue retention, duplicate_window 2 min; store ${acct?.storage ?? '?'} bytes in use at start`,
    ],
    async open() {
      const nc = await connect({ servers });
      return { nc, js: jetstream(nc) };
    },
    async close(c) {
      await c.nc.close();
    },
    async enqueue(c, key) {
      const pa = await c.js.publish(subj, PAYLOAD_BYTES_BUF, key ? { msgID: key } : undefined);
      return pa.duplicate === true;
    },
    async prefillKeys(keys) {
      const acks = await Promise.all(keys.map((k) => adminJs.publish(subj, PAYLOAD_BYTES_BUF, { msgID: k })));
      const dups = acks.filter((p) => p.duplicate).length;
      if (dups) throw new Error(`${dups} prefill keys were already duplicates`);
    },
    async fill(n) {
      // Asynchronous publishes, 512 in flight.
      let next = 0;
      const one = async () => {
        while (next < n) {
          next++;
          await adminJs.publish(subj, PAYLOAD_BYTES_BUF);
        }
      };
      await Promise.all(Array.from({ length: 512 }, one));
      const si = await jsm.streams.info(POINT);
      return si.state.messages;
    },
    async countJobs() {
      return (await jsm.streams.info(POINT)).state.messages;
    },
    async openWorkers(workers) {
      // One durable pull consumer shared by N connections; each fetches 1 message and acks it
      // with ackAck (waits for the server's confirmation).
      const conns = await openAll(this, workers);
      for (const c of conns) c.consumer = await c.js.consumers.get(POINT, durable);
      return conns;
    },
    async closeWorkers(conns) {
      await Promise.all(conns.map((c) => c.nc.close().catch(() => {})));
    },
    async drain(conns, n, deadlineMs, stats) {
      let taken = 0;
      let inflight = 0;
      let done = 0;
      let tEnd = null;
      const t0 = nowMs();
      const loop = async (consumer) => {
        let fails = 0;
        while (done < n && Date.now() < deadlineMs) {
          const s = nowMs();
          try {
            inflight++;
            const m = await consumer.next({ expires: 1000 }).finally(() => inflight--);
            if (!m) {
              if (taken >= n) break;
              // Jobs nobody else could be fetching: the reply was wrong.
              if (n - taken > inflight) stats.anomaly('fetch found no message while jobs were not yet handed out');
              continue;
            }
            taken++;
            const ok = await m.ackAck();
            if (!ok) throw new Error('ackAck returned false');
            stats.lat.push(nowMs() - s);
            fails = 0;
            if (++done === n) tEnd = nowMs();
          } catch (e) {
            stats.error(e);
            if (++fails >= MAX_FAILS_IN_A_ROW) break;
          }
        }
      };
      await Promise.all(conns.map((c) => loop(c.consumer)));
      return { done, t0, tEnd: tEnd ?? nowMs(), timedOut: done < n };
    },
    async openCycle() {
      const c = await this.open();
      c.consumer = await c.js.consumers.get(POINT, durable);
      return c;
    },
    async closeCycle(c) {
      await c.nc.close();
    },
    async cycle(c, stats) {
      const pa = await c.js.publish(subj, PAYLOAD_BYTES_BUF);
      const m = await c.consumer.next({ expires: 5000 });
      if (!m) throw new Error('fetch returned no message');
      if (m.seq !== pa.seq) stats.anomaly('reserved a different message than the one just published');
      const ok = await m.ackAck();
      if (!ok) throw new Error('ackAck returned false');
    },
    async cleanup() {
      await jsm.streams.delete(POINT);
    },
    async shutdown() {
      await adminNc.close();
    },
  };
  return a;
}

// ---------------------------------------------------------------- pg-boss

async function pgbossAdapter(url) {
  const { default: PgBoss } = await import('pg-boss');
  const pg = (await import('pg')).default;
  const appName = `sepp-peer-${RUN_ID}`;
  const pgOptions = [A['pg-options'], A['pg-synchronous-commit'] && `-c synchronous_commit=${A['pg-synchronous-commit']}`].filter(Boolean).join(' ') || undefined;
  const dedup = A['pgboss-dedup'];
  const keyed = A.workload === 'unique' || A.workload === 'hits';
  // A 'short' queue refuses a second *queued* job with the same singletonKey (unique index on
  // (name, singleton_key) where state = 'created'). A keyless job has singleton_key NULL,
  // which that index treats as '', so keyless workloads use a standard queue.
  const policy = keyed && dedup === 'policy' ? 'short' : 'standard';
  const SINGLETON_SECONDS = 43200; // pg-boss caps it at its archive interval (12 h)
  const base = {
    connectionString: url,
    application_name: appName,
    supervise: false,
    schedule: false,
    ...(pgOptions ? { options: pgOptions } : {}),
  };
  const adminPg = new pg.Client({ connectionString: url, application_name: `${appName}-admin`, ...(pgOptions ? { options: pgOptions } : {}) });
  await adminPg.connect();
  const q1 = async (sql, params) => (await adminPg.query(sql, params)).rows;
  const [{ server_version: pgVersion }] = await q1('SHOW server_version');
  const [{ synchronous_commit: syncCommit }] = await q1('SHOW synchronous_commit');
  const [{ max_connections: maxConn }] = await q1('SHOW max_connections');
  const [{ n: inUse }] = await q1('SELECT count(*)::int AS n FROM pg_stat_activity');
  const need = (A.workload === 'cycle' ? 1 : CONNS) + 1;
  const free = Number(maxConn) - 3 - inUse; // 3 = superuser_reserved_connections default
  if (need > free) {
    await adminPg.end();
    return { versions: { 'pg-boss': pkgVersion('pg-boss'), pg: pkgVersion('pg'), server: `PostgreSQL ${pgVersion}` }, unsupported: `PostgreSQL max_connections = ${maxConn}, ${inUse} in use: ${need} more connections (one pg-boss instance with a pool of 1 per connection, plus the admin) do not fit` };
  }

  const admin = new PgBoss({ ...base, max: 1, migrate: true });
  admin.on('error', (e) => log('pg-boss admin error:', e.message));
  await admin.start();
  await admin.createQueue(POINT, { policy });

  const sendOpts = (key) => {
    if (!key) return undefined;
    if (dedup === 'seconds') return { singletonKey: key, singletonSeconds: SINGLETON_SECONDS };
    return { singletonKey: key };
  };
  const dedupNote = {
    policy: `keyed workloads: singletonKey on a queue created with policy 'short' (unique (name, singleton_key) among jobs in state 'created'; send() returns null for a duplicate)`,
    seconds: `keyed workloads: singletonKey + singletonSeconds ${SINGLETON_SECONDS} on a standard queue (unique (name, singleton_on, singleton_key); dedup window is the fixed UTC-aligned ${SINGLETON_SECONDS} s slot)`,
    none: 'keyed workloads: singletonKey alone on a standard queue (pg-boss 10 does NOT deduplicate in this setting)',
  }[dedup];

  const a = {
    versions: { 'pg-boss': pkgVersion('pg-boss'), pg: pkgVersion('pg'), server: `PostgreSQL ${pgVersion}` },
    notes: [
      `PostgreSQL ${pgVersion}, synchronous_commit ${syncCommit}${pgOptions ? ` (connection options '${pgOptions}')` : ''}; queue policy '${policy}'`,
      ...(keyed ? [dedupNote] : []),
      'each connection is its own PgBoss instance (pool max 1, supervise and schedule off, so no maintenance runs during the point)',
    ],
    async excludedPids() {
      // Other clients' backends on the shared postmaster are not this peer's work.
      const rows = await q1(`SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND (application_name IS NULL OR application_name NOT LIKE $1)`, [`${appName}%`]);
      return new Set(rows.map((r) => r.pid));
    },
    async open() {
      const b = new PgBoss({ ...base, max: 1, migrate: false });
      b.on('error', (e) => log('pg-boss error:', e.message));
      await b.start();
      if (!a.checked) {
        // The setting that matters is the one on the pg-boss connections themselves.
        a.checked = true;
        const { rows } = await b.getDb().executeSql('SHOW synchronous_commit');
        a.notes.push(`synchronous_commit on a pg-boss connection: ${rows[0].synchronous_commit}`);
      }
      return b;
    },
    async close(b) {
      await b.stop({ graceful: false, wait: true, timeout: 1000 });
    },
    async enqueue(b, key, mark) {
      const id = await b.send(POINT, { p: payloadStr(mark) }, sendOpts(key));
      return id === null;
    },
    async prefillKeys(keys) {
      for (let i = 0; i < keys.length; i += 500) {
        await admin.insert(keys.slice(i, i + 500).map((k) => ({ name: POINT, data: { p: payloadStr('o') }, singletonKey: k, ...(dedup === 'seconds' ? { singletonSeconds: SINGLETON_SECONDS } : {}) })));
      }
      const [{ n }] = await q1(`SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1`, [POINT]);
      if (n !== keys.length) throw new Error(`prefill stored ${n} jobs for ${keys.length} keys`);
    },
    async countJobs() {
      const [{ n }] = await q1(`SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1`, [POINT]);
      return n;
    },
    async fill(n) {
      for (let i = 0; i < n; i += 1000) {
        const m = Math.min(1000, n - i);
        await admin.insert(Array.from({ length: m }, () => ({ name: POINT, data: { p: payloadStr('x') } })));
      }
      const [{ c }] = await q1(`SELECT count(*)::int AS c FROM pgboss.job WHERE name = $1 AND state = 'created'`, [POINT]);
      return c;
    },
    async openWorkers(workers) {
      return openAll(this, workers);
    },
    async closeWorkers(bs) {
      await Promise.all(bs.map((b) => this.close(b).catch(() => {})));
    },
    async drain(bs, n, deadlineMs, stats) {
      let taken = 0;
      let inflight = 0;
      let done = 0;
      let tEnd = null;
      const t0 = nowMs();
      const loop = async (b) => {
        let fails = 0;
        while (done < n && Date.now() < deadlineMs) {
          const s = nowMs();
          try {
            // Note: pg-boss 10's fetch() swallows SQL errors and returns [] (see manager.js).
            inflight++;
            const [job] = await b.fetch(POINT, { batchSize: 1 }).finally(() => inflight--);
            if (!job) {
              if (taken >= n) break;
              // SKIP LOCKED passes over rows other fetches hold: only jobs that nobody else
              // could be fetching make an empty answer wrong.
              if (n - taken > inflight) stats.anomaly('fetch found no job while jobs were not yet handed out');
              continue;
            }
            taken++;
            const r = await b.complete(POINT, job.id);
            if (r.affected !== 1) throw new Error(`complete affected ${r.affected} jobs`);
            stats.lat.push(nowMs() - s);
            fails = 0;
            if (++done === n) tEnd = nowMs();
          } catch (e) {
            stats.error(e);
            if (++fails >= MAX_FAILS_IN_A_ROW) break;
          }
        }
      };
      await Promise.all(bs.map(loop));
      return { done, t0, tEnd: tEnd ?? nowMs(), timedOut: done < n };
    },
    async openCycle() {
      return this.open();
    },
    async closeCycle(b) {
      await this.close(b);
    },
    async cycle(b, stats) {
      const id = await b.send(POINT, { p: payloadStr('x') });
      if (!id) throw new Error('send returned null');
      const [job] = await b.fetch(POINT, { batchSize: 1 });
      if (!job) throw new Error('fetch returned no job');
      if (job.id !== id) stats.anomaly('reserved a different job than the one just enqueued');
      const r = await b.complete(POINT, job.id);
      if (r.affected !== 1) throw new Error(`complete affected ${r.affected} jobs`);
    },
    async cleanup() {
      // pg-boss 10.4's deleteQueue() deletes the queue row before it drops the queue's job
      // partition, so the q_fkey check refuses any queue that still holds jobs. Drop the
      // partition first (cheaper than deleting the rows), then let deleteQueue() finish.
      const [row] = await q1('SELECT partition_name FROM pgboss.queue WHERE name = $1', [POINT]);
      if (row?.partition_name) await q1(`DROP TABLE IF EXISTS pgboss.${pg.escapeIdentifier(row.partition_name)}`);
      await admin.deleteQueue(POINT);
    },
    async shutdown() {
      await admin.stop({ graceful: false, wait: true, timeout: 1000 });
      await adminPg.end();
    },
  };
  return a;
}

// ---------------------------------------------------------------- the point

/**
 * Closed loop: every connection has one call in flight. Calls started in the measured window
 * count; the window ends at the end of the last call started inside it.
 */
async function closedLoop(clients, call, stats) {
  const tStart = nowMs();
  const mStart = tStart + WARMUP * 1000;
  const mEnd = mStart + DURATION * 1000;
  let lastEnd = mStart;
  let gaveUp = 0;
  const loop = async (c, ci) => {
    let fails = 0;
    let seq = 0;
    for (;;) {
      const s = nowMs();
      if (s >= mEnd) break;
      const measured = s >= mStart;
      try {
        await call(c, ci, seq++, measured);
        const e = nowMs();
        fails = 0;
        if (measured) {
          stats.jobs++;
          stats.lat.push(e - s);
          if (e > lastEnd) lastEnd = e;
        }
      } catch (e) {
        if (measured) {
          stats.error(e);
          const t = nowMs();
          if (t > lastEnd) lastEnd = t;
        }
        if (++fails >= MAX_FAILS_IN_A_ROW) {
          gaveUp++;
          break;
        }
        await sleep(5);
      }
    }
  };
  const waitMeasure = sleep(WARMUP * 1000);
  const loops = clients.map(loop);
  await waitMeasure;
  await mon.start();
  const cpu0 = process.cpuUsage();
  await Promise.all(loops);
  const cpu1 = process.cpuUsage(cpu0);
  const srv = await mon.stop();
  return { elapsed: (lastEnd - mStart) / 1000, gaveUp, srv, clientCpu: (cpu1.user + cpu1.system) / 1e6 };
}

async function openAll(adapter, n) {
  const out = [];
  for (let i = 0; i < n; i += 16) {
    out.push(...(await Promise.all(Array.from({ length: Math.min(16, n - i) }, () => adapter.open()))));
  }
  return out;
}

let mon = new ServerMonitor([]);

async function main() {
  const t0 = Date.now();
  const stats = new Stats();
  const base = {
    system: A.system,
    label: A.label ?? A.system,
    workload: A.workload,
    connections: CONNS,
    shared_connection: SHARED,
    payload_bytes: PAYLOAD_BYTES,
    point: POINT,
  };
  const make = { bullmq: bullmqAdapter, nats: natsAdapter, pgboss: pgbossAdapter }[A.system];
  const adapter = await make(A.url);
  if (adapter.unsupported) {
    return { ...base, unsupported: adapter.unsupported, versions: { node: process.version, ...adapter.versions } };
  }
  mon = new ServerMonitor(SERVER_PIDS, adapter.excludedPids?.bind(adapter));
  const notes = adapter.notes;
  let run;
  let cleanupError = null;
  try {
    if (A.workload === 'nokey' || A.workload === 'unique' || A.workload === 'hits') {
      let hitKeys = null;
      let next = 0;
      if (A.workload === 'hits') {
        hitKeys = Array.from({ length: HIT_KEYS }, (_, i) => `h-${RUN_ID}-${i}`);
        await adapter.prefillKeys(hitKeys);
      }
      // With --shared-connection every loop calls the one shared client.
      const shared = SHARED ? await adapter.openShared() : null;
      const clients = shared ? Array(CONNS).fill(shared.q) : await openAll(adapter, CONNS);
      // Over the whole point, warm-up included, for the read-back check below.
      let accepted = 0; // replies that did not say "duplicate" (null = cannot tell counts here)
      let failed = 0; // calls that threw (they may or may not have stored a job)
      const enq = async (c, key, mark) => {
        try {
          const dup = await adapter.enqueue(c, key, mark);
          if (dup !== true) accepted++;
          return dup;
        } catch (e) {
          failed++;
          throw e;
        }
      };
      const call = {
        nokey: async (c) => {
          const dup = await enq(c, null, 'x');
          if (dup === true) stats.anomaly('a keyless enqueue was reported as a duplicate');
        },
        unique: async (c, ci, seq, measured) => {
          const dup = await enq(c, `k-${RUN_ID}-${ci}-${seq}`, 'x');
          if (dup === true && measured) stats.anomaly('a fresh key was reported as a duplicate');
        },
        hits: async (c, ci, seq, measured) => {
          const key = hitKeys[next++ % HIT_KEYS];
          const dup = await enq(c, key, 'h');
          if (dup === false && measured) stats.anomaly('a repeated key was not reported as a duplicate');
        },
      }[A.workload];
      run = await closedLoop(clients, call, stats);
      if (A.workload !== 'nokey') {
        // Read back what the server stored. 'unique': one job per enqueue that did not say
        // duplicate. 'hits': only the prefilled jobs (plus any the replies admitted to).
        const canTell = A.system !== 'bullmq';
        const expected = A.workload === 'unique' ? accepted : HIT_KEYS + (canTell ? accepted : 0);
        const stored = await adapter.countJobs();
        notes.push(`read-back after the point: ${stored} jobs stored, ${expected} expected (${failed} calls failed)`);
        if (stored < expected) for (let i = 0; i < expected - stored; i++) stats.anomaly('read-back: fewer jobs stored than enqueues acknowledged');
        if (stored > expected + failed) {
          const msg = A.workload === 'hits' ? 'read-back: a repeated key stored a new job' : 'read-back: more jobs stored than enqueues acknowledged';
          for (let i = 0; i < stored - expected - failed; i++) stats.anomaly(msg);
        }
        if (A.workload === 'hits' && adapter.afterHits) await adapter.afterHits(stats, hitKeys);
        if (!canTell) notes.push('BullMQ does not tell the producer whether a jobId already existed: duplicates are detected only by the read-back');
      }
      if (shared) await adapter.closeShared(shared).catch((e) => log('close:', e.message));
      else await Promise.all(clients.map((c) => adapter.close(c).catch((e) => log('close:', e.message))));
    } else if (A.workload === 'drain') {
      const tf = nowMs();
      const filled = await adapter.fill(DRAIN_JOBS);
      log(`filled ${filled} jobs in ${((nowMs() - tf) / 1000).toFixed(2)} s`);
      if (filled !== DRAIN_JOBS) stats.anomaly(`the fill left ${filled} jobs in the queue, not ${DRAIN_JOBS}`);
      const limitS = 3 * DURATION + 2;
      const workers = await adapter.openWorkers(CONNS, stats);
      await mon.start();
      const cpu0 = process.cpuUsage();
      const deadline = Date.now() + limitS * 1000;
      const d = await adapter.drain(workers, DRAIN_JOBS, deadline, stats);
      const cpu1 = process.cpuUsage(cpu0);
      const srv = await mon.stop();
      await adapter.closeWorkers(workers);
      stats.jobs = d.done;
      if (d.timedOut) notes.push(`stopped after ${limitS} s (3 x duration + 2): ${d.done} of ${DRAIN_JOBS} jobs acked`);
      notes.push(`drain of ${DRAIN_JOBS} jobs filled before the point (not measured); timed from the first fetch to the last ack; worker connections opened before the clock starts`);
      run = { elapsed: (d.tEnd - d.t0) / 1000, gaveUp: 0, srv, clientCpu: (cpu1.user + cpu1.system) / 1e6, drain: { jobs: DRAIN_JOBS, complete: !d.timedOut && d.done === DRAIN_JOBS } };
    } else if (A.workload === 'cycle') {
      const c = await adapter.openCycle();
      run = await closedLoop([c], (cc) => adapter.cycle(cc, stats), stats);
      await adapter.closeCycle(c).catch((e) => log('close:', e.message));
      if (A.system === 'bullmq') notes.push('cycle: Queue.add, then Worker.getNextJob + job.moveToCompleted(fetchNext=false); the Queue and the Worker each have their own Redis connection');
    }
  } finally {
    try {
      await adapter.cleanup();
    } catch (e) {
      cleanupError = e.message;
    }
    await adapter.shutdown().catch((e) => log('shutdown:', e.message));
  }
  if (cleanupError) notes.push(`cleanup failed: ${cleanupError}`);
  if (run.gaveUp) notes.push(`${run.gaveUp} connection(s) gave up after ${MAX_FAILS_IN_A_ROW} failures in a row`);
  if (A.workload === 'drain') notes.push(A.system === 'bullmq' ? 'drain latency: time between consecutive completions of one Worker' : 'drain latency: one fetch + ack per sample');
  if (A.workload === 'cycle') notes.push('cycle latency: one enqueue -> reserve -> ack round per sample');

  const elapsed = run.elapsed;
  const srv = run.srv;
  const r3 = (v, d = 3) => (v == null ? null : Math.round(v * 10 ** d) / 10 ** d);
  return {
    ...base,
    elapsed_s: r3(elapsed),
    jobs: stats.jobs,
    jobs_per_s: elapsed > 0 ? Math.round((stats.jobs / elapsed) * 10) / 10 : null,
    ...(run.drain ? { drain_jobs: run.drain.jobs, drain_complete: run.drain.complete } : {}),
    latency_ms: stats.latency(),
    errors: stats.errors,
    anomalies: stats.anomalies,
    messages: Object.fromEntries(stats.messages),
    server_cpu_s: r3(srv.cpu_s),
    server_cpu_s_per_1k_jobs: srv.cpu_s != null && stats.jobs ? r3((srv.cpu_s * 1000) / stats.jobs, 4) : null,
    server_peak_rss_mib: r3(srv.peak_rss_mib, 1),
    server_peak_pss_mib: r3(srv.peak_pss_mib, 1),
    server_processes: srv.processes ?? null,
    client_cpu_s: r3(run.clientCpu),
    // CPU used during the window by everything but the server tree and this process, in cores:
    // well above 0 means something else ran beside the point. io_pressure_pct: share of the
    // window in which some task was stalled on IO (/proc/pressure/io), e.g. another fsyncing job.
    other_load_cores: srv.machine?.busy_s != null && srv.machine.wall_s > 0 ? r3((srv.machine.busy_s - (srv.cpu_s ?? 0) - run.clientCpu) / srv.machine.wall_s, 2) : null,
    io_pressure_pct: r3(srv.machine?.io_some_pct, 1),
    notes,
    versions: { node: process.version, ...adapter.versions },
    wall_s: r3((Date.now() - t0) / 1000, 1),
  };
}

main().then(
  (out) => {
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exit(0);
  },
  (e) => {
    console.error(e?.stack || e);
    process.stdout.write(JSON.stringify({ system: A.system, label: A.label ?? A.system, workload: A.workload, connections: CONNS, failed: String(e?.message || e) }) + '\n');
    process.exit(1);
  },
);
