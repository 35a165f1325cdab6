// Walks a directory tree and enqueues one `sha256-file` job per regular file, keyed by the
// file's path and modification time: running it twice over an unchanged tree creates no new
// job (every enqueue is a dedup hit), and a file that changed gets a fresh job. The keys are
// the Rust example's (core/examples/checksum_producer.rs), so the two producers deduplicate
// each other.
//
//   node checksum_producer.js /usr/share [--server http://127.0.0.1:50051] [--queue checksums] [--batch 200]

import { createHash } from "node:crypto";
import { lstatSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { type EnqueueRequest, SeppClient } from "sepp";

const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    server: { type: "string", default: "http://127.0.0.1:50051" },
    queue: { type: "string", default: "checksums" },
    batch: { type: "string", default: "200" },
  },
});
const root = positionals[0];
if (root === undefined) {
  console.error("usage: checksum_producer DIRECTORY [--server URL] [--queue NAME] [--batch N]");
  process.exit(2);
}
/** Jobs per enqueueBatch call (the server allows up to its `maxEnqueueBatch`). */
const batchSize = Math.max(1, Number.parseInt(flags.batch, 10) || 200);

interface File {
  path: string;
  /** Modification time in nanoseconds since the Unix epoch. */
  mtimeNs: bigint;
}

/** Regular files under `dir`, depth first; unreadable directories and symlinks are skipped. */
function walk(dir: string, out: File[]): void {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const entry of entries) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      walk(path, out);
    } else if (entry.isFile()) {
      try {
        out.push({ path, mtimeNs: lstatSync(path, { bigint: true }).mtimeNs });
      } catch {
        // Vanished since the listing.
      }
    }
  }
}

/** The idempotency key: mtime and path, or their SHA-256 when that would be too long. */
function keyFor(file: File, limitBytes: number): string {
  const plain = `${file.mtimeNs}:${file.path}`;
  if (Buffer.byteLength(plain) <= limitBytes) return plain;
  return createHash("sha256").update(plain).digest("hex");
}

const client = await SeppClient.connect(flags.server);
const { maxIdempotencyKeyBytes } = await client.getServerInfo();

const t0 = performance.now();
const files: File[] = [];
walk(root, files);
const walkedMs = performance.now() - t0;

let created = 0;
let deduplicated = 0;
let rejected = 0;
const t1 = performance.now();
for (let i = 0; i < files.length; i += batchSize) {
  const requests = files.slice(i, i + batchSize).map(
    (file): EnqueueRequest => ({
      queue: flags.queue,
      jobType: "sha256-file",
      payload: { data: Buffer.from(file.path), encoding: "text/plain; charset=utf-8" },
      idempotencyKey: keyFor(file, maxIdempotencyKeyBytes),
    }),
  );
  for (const result of await client.enqueueBatch(requests)) {
    if (result.status === "rejected") {
      rejected += 1;
      console.error(`rejected: ${result.error.message}`);
    } else if (result.deduplicated) {
      deduplicated += 1;
    } else {
      created += 1;
    }
  }
}
const enqueuedMs = performance.now() - t1;
client.close();

console.log(
  `${files.length} files under ${root} (walked in ${(walkedMs / 1000).toFixed(2)} s); ` +
    `enqueued in ${(enqueuedMs / 1000).toFixed(2)} s: ${created} new, ${deduplicated} already enqueued, ${rejected} rejected`,
);
