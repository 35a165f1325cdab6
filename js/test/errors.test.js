// The error classes, and the errors each kind of bad input or failure produces.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { after, before, describe, test } from "node:test";
import * as sepp from "sepp";
import {
  CustomEntriesTooManyError,
  CustomKeyTooLongError,
  CustomMapTooLargeError,
  EncodingNotAllowedError,
  FailedPreconditionError,
  IdempotencyKeyTooLongError,
  InvalidArgumentError,
  InvalidConfigError,
  InvalidRequestError,
  JobTypeNameTooLongError,
  JobTypeNotAllowedError,
  PayloadTooLargeError,
  QueueFullError,
  QueueNameTooLongError,
  JobRejectedError,
  ScheduledTooFarError,
  SeppClient,
  SeppError,
  TransportError,
  UnknownQueueError,
  errorClassNames,
  errorClasses,
  errorCodes,
} from "sepp";
import { startServer } from "../test-support/server.js";

const T = { timeout: 30_000 };

/** Asserts a `TypeError` naming `field`, with Node's code for a bad argument. */
function isTypeError(field) {
  return (/** @type {any} */ e) => {
    assert.ok(e instanceof TypeError, `a TypeError, got ${e}`);
    assert.equal(e.code, "ERR_INVALID_ARG_TYPE");
    assert.ok(e.message.includes(field), `${JSON.stringify(e.message)} names ${field}`);
    return true;
  };
}

describe("the error classes", T, () => {
  test("every code of the core has a class, picked by its code", () => {
    const codes = errorCodes();
    assert.deepEqual(Object.keys(errorClasses).sort(), [...codes].sort());
    for (const code of codes) {
      const Class = errorClasses[/** @type {keyof typeof errorClasses} */ (code)];
      assert.equal(Class.code, code);
      const e = new Class("m", { limit: 1 });
      assert.ok(e instanceof SeppError && e instanceof Error);
      assert.equal(e.code, code);
      assert.equal(e.name, Class.name);
      assert.equal(/** @type {any} */ (e).limit, 1);
      assert.equal(/** @type {any} */ (sepp)[Class.name], Class, `${Class.name} is exported`);
    }
  });

  test("every class is declared in errors.d.ts with its code", async () => {
    const dts = await readFile(new URL("../errors.d.ts", import.meta.url), "utf8");
    for (const [code, Class] of Object.entries(errorClasses)) {
      const decl = new RegExp(
        `export declare class ${Class.name} extends (SeppError|JobRejectedError|LeaseLostError) \\{[^}]*static readonly code: "${code}"`,
      );
      assert.match(dts, decl, `${Class.name} is declared with code ${code}`);
      assert.ok(dts.includes(`"${code}"`), `ErrorCode lists ${code}`);
    }
  });

  test("every class is named for its code as the core's table says, and has that .code", () => {
    const names = errorClassNames();
    assert.deepEqual(Object.keys(names).sort(), [...errorCodes()].sort());
    for (const [code, name] of Object.entries(names)) {
      assert.equal(name, `${code.split("_").map((w) => w[0] + w.slice(1).toLowerCase()).join("")}Error`);
      const Class = /** @type {any} */ (sepp)[name];
      assert.equal(typeof Class, "function", `sepp exports ${name}`);
      assert.equal(Class.name, name);
      assert.equal(Class.code, code);
      assert.equal(new Class("m").code, code);
      assert.equal(errorClasses[/** @type {keyof typeof errorClasses} */ (code)], Class);
    }
  });

  test("the names of earlier releases are deprecated aliases of the same classes", () => {
    assert.equal(/** @type {any} */ (sepp).Transport, sepp.TransportError);
    assert.equal(/** @type {any} */ (sepp).QueueFull, sepp.QueueFullError);
    assert.equal(/** @type {any} */ (sepp).JobNotInFlight, sepp.JobNotInFlightError);
    assert.equal(/** @type {any} */ (sepp).Rejection, sepp.JobRejectedError);
    assert.ok(new sepp.JobNotInFlightError("m") instanceof sepp.LeaseLostError);
    assert.ok(new sepp.AttemptMismatchError("m") instanceof sepp.LeaseLostError);
  });

  test("rejection codes extend JobRejectedError, call failures do not", () => {
    assert.ok(new IdempotencyKeyTooLongError("m") instanceof JobRejectedError);
    assert.ok(new QueueFullError("m") instanceof JobRejectedError);
    assert.ok(!(new TransportError("m") instanceof JobRejectedError));
    assert.ok(!(new InvalidArgumentError("m") instanceof JobRejectedError));
  });
});

describe("checks made before anything is sent", T, () => {
  /** @type {SeppClient} */
  let client;

  before(async () => {
    // Connect, then stop the server: a check that reached the network would fail with
    // TransportError instead of the expected error.
    const server = await startServer();
    client = await SeppClient.connect(server.url, {
      connectTimeoutMs: 1_000,
      rpcTimeoutMs: 2_000,
    });
    await server.stop();
  });

  after(() => client?.close());

  test("the server is really gone: a call that is sent fails with Transport", async () => {
    await assert.rejects(client.enqueue({ queue: "q", jobType: "t" }), (e) => {
      assert.ok(e instanceof TransportError);
      assert.equal(e.retryable, true);
      return true;
    });
  });

  test("a 257-byte idempotency key rejects with IdempotencyKeyTooLong", async () => {
    await assert.rejects(
      client.enqueue({ queue: "q", jobType: "t", idempotencyKey: "k".repeat(257) }),
      (e) => {
        assert.ok(e instanceof IdempotencyKeyTooLongError);
        assert.ok(e instanceof JobRejectedError);
        assert.ok(e instanceof SeppError);
        assert.equal(e.code, "IDEMPOTENCY_KEY_TOO_LONG");
        assert.equal(e.limit, 256);
        assert.equal(e.actual, 257);
        assert.equal(e.retryable, false);
        assert.equal(e.message, "idempotency_key is 257 bytes, max_idempotency_key_bytes is 256");
        return true;
      },
    );
  });

  test("the key is measured in UTF-8 bytes", async () => {
    await assert.rejects(
      client.enqueue({ queue: "q", jobType: "t", idempotencyKey: "€".repeat(86) }),
      (e) => e instanceof IdempotencyKeyTooLongError && e.actual === 258,
    );
  });

  test("invalid values reject with the matching sepp error", async () => {
    const cases = [
      [() => client.enqueue({ queue: "", jobType: "t" }), InvalidRequestError, /queue: queue name is empty/],
      [() => client.enqueue({ queue: "q", jobType: "t", priority: 10 }), InvalidRequestError, /priority/],
      [() => client.enqueue({ queue: "q", jobType: "t", priority: 1.5 }), InvalidRequestError, /priority/],
      [
        () => client.enqueue({ queue: "q", jobType: "t", priority: Infinity }),
        InvalidRequestError,
        /^invalid request: priority is Infinity: expected an integer from 0 to 4294967295$/,
      ],
      [() => client.enqueue({ queue: "q", jobType: "t", maxAttempts: 0 }), InvalidRequestError, /max_att/],
      [() => client.enqueue({ queue: "q", jobType: "t", idempotencyKey: "" }), InvalidRequestError, /key/],
      [
        () => client.enqueue({ queue: "q", jobType: "t", scheduledAt: new Date("not a date") }),
        InvalidRequestError,
        /scheduled_at is an invalid Date/,
      ],
      [
        () => client.enqueue({
          queue: "q",
          jobType: "t",
          payload: { data: new Uint8Array(), encoding: "x" },
        }),
        InvalidRequestError,
        /payload/,
      ],
      [
        () => client.enqueue({ queue: "q", jobType: "t", custom: { n: 2n ** 64n } }),
        InvalidRequestError,
        /custom\["n"\] is outside the signed 64-bit integer range/,
      ],
      [
        () => client.reserve({ queues: ["q"], leaseDurationMs: -5 }),
        InvalidArgumentError,
        /leaseDurationMs is -5/,
      ],
      [() => client.reserve({ queues: ["q"], leaseDurationMs: 0 }), InvalidArgumentError, /^leaseDurationMs is 0/],
      [() => client.reserve({ queues: [], leaseDurationMs: 1_000 }), InvalidArgumentError, /queues/],
      [
        () => client.reserve({ queues: ["q"], leaseDurationMs: 1_000, waitTimeoutMs: Number.NaN }),
        InvalidArgumentError,
        /waitTimeoutMs/,
      ],
      [() => client.ack("id", -1), InvalidArgumentError, /attempt/],
      [() => client.extend("id", 1, -1), InvalidArgumentError, /leaseDurationMs/],
      [() => client.nack("id", 1, { retry: { delayMs: -1 } }), InvalidArgumentError, /delayMs/],
      [() => client.drainDeadLetters({ max: 0 }), InvalidArgumentError, /max/],
    ];
    for (const [promise, Class, message] of cases) {
      await assert.rejects(promise, (e) => {
        assert.ok(e instanceof Class, `${e} is a ${Class.name}`);
        assert.match(String(/** @type {Error} */ (e).message), message);
        return true;
      });
    }
  });

  test("a value that cannot be held is a rejection in its slot of a batch, as in Python", async () => {
    // Every slot is refused before sending, so no call goes out to the stopped server.
    const bad = { queue: "q", jobType: "t", priority: -1 };
    const message = "invalid request: priority is -1: expected an integer from 0 to 4294967295";
    await assert.rejects(client.enqueue(bad), (e) => e instanceof InvalidRequestError && e.message === message);
    const results = await client.enqueueBatch([bad, { queue: "", jobType: "t" }]);
    assert.deepEqual(
      results.map((r) => (r.status === "rejected" ? [r.error.constructor.name, r.error.message] : r.status)),
      [
        ["InvalidRequestError", message],
        ["InvalidRequestError", "invalid request: queue: queue name is empty"],
      ],
    );
    const atomic = await client.enqueueAtomic([bad]);
    assert.equal(atomic.status, "rejected");
    if (atomic.status === "rejected") assert.deepEqual(atomic.failures.map((f) => f.index), [0]);
  });

  test("a mistyped or missing field rejects with a TypeError naming it", async () => {
    const c = /** @type {any} */ (client);
    const cases = [
      [() => c.enqueue({ queue: "q", jobType: 5 }), "request.jobType"],
      [() => c.enqueue({ queue: "q" }), "request.jobType"],
      [() => c.enqueue(), "request"],
      [() => c.enqueue("q"), "request"],
      [() => c.enqueue({ queue: "q", jobType: "t", priority: "high" }), "request.priority"],
      [() => c.enqueue({ queue: "q", jobType: "t", scheduledAt: Date.now() }), "request.scheduledAt"],
      [() => c.enqueue({ queue: "q", jobType: "t", payload: { data: "x", encoding: "e" } }), "data"],
      [() => c.enqueue({ queue: "q", jobType: "t", payload: { data: new Uint8Array(1) } }), "encoding"],
      [() => c.enqueue({ queue: "q", jobType: "t", custom: { a: {} } }), "request.custom.a"],
      [() => c.enqueue({ queue: "q", jobType: "t", traceContext: {} }), "traceparent"],
      [() => c.enqueueBatch({}), "requests"],
      [() => c.enqueueBatch([{ queue: "q", jobType: "t" }, null]), "requests[1]"],
      [() => c.enqueueAtomic([{ queue: 1, jobType: "t" }]), "requests[0].queue"],
      [() => c.reserve({ queues: "q", leaseDurationMs: 1 }), "options.queues"],
      [() => c.reserve({ queues: ["q", 2], leaseDurationMs: 1 }), "options.queues[1]"],
      [() => c.reserve({ queues: ["q"] }), "options.leaseDurationMs"],
      [() => c.ack(1, 1), "jobId"],
      [() => c.ack("id", "1"), "attempt"],
      [() => c.nack("id", 1, { retry: "later" }), "options.retry"],
      [() => c.nack("id", 1, { reason: 5 }), "options.reason"],
      [() => c.extend("id", 1), "leaseDurationMs"],
      [() => c.drainDeadLetters({ queue: 1, max: 1 }), "options.queue"],
    ];
    for (const [promise, field] of cases) {
      await assert.rejects(promise, isTypeError(field));
    }
  });
});

describe("connect", T, () => {
  test("an unusable url or option rejects with InvalidConfig", async () => {
    await assert.rejects(SeppClient.connect("ftp://127.0.0.1:1"), InvalidConfigError);
    await assert.rejects(SeppClient.connect(""), InvalidConfigError);
    await assert.rejects(
      SeppClient.connect("127.0.0.1:1", { rpcTimeoutMs: -1 }),
      (e) => e instanceof InvalidConfigError && /rpcTimeoutMs/.test(e.message),
    );
  });

  test("mistyped arguments reject with a TypeError", async () => {
    const C = /** @type {any} */ (SeppClient);
    await assert.rejects(C.connect(), isTypeError("url"));
    await assert.rejects(C.connect(42), isTypeError("url"));
    await assert.rejects(C.connect("127.0.0.1:1", "x"), isTypeError("options"));
    await assert.rejects(C.connect("127.0.0.1:1", { apiKey: 1 }), isTypeError("options.apiKey"));
    await assert.rejects(
      C.connect("127.0.0.1:1", { retryPolicy: { maxRetries: "3" } }),
      isTypeError("options.retryPolicy.maxRetries"),
    );
  });

  test("calls cut off by a killed server reject with Transport", async () => {
    const server = await startServer();
    const client = await SeppClient.connect(server.url, { retryPolicy: null });
    let done = 0;
    const produce = async (p) => {
      for (let i = 0; ; i++) {
        try {
          await client.enqueue({
            queue: "cut",
            jobType: "t",
            payload: { data: Buffer.alloc(4096, 1), encoding: "application/octet-stream" },
            idempotencyKey: `p${p}-${i}`,
          });
        } catch (e) {
          return e;
        }
        done++;
      }
    };
    const producers = Array.from({ length: 16 }, (_, p) => produce(p));
    while (done < 300) await new Promise((r) => setTimeout(r, 5));
    await server.stop(); // SIGKILL while 16 calls are on the wire
    for (const e of await Promise.all(producers)) {
      assert.ok(e instanceof TransportError, `${e}`);
      assert.equal(e.retryable, true);
    }
  });

  test("a server that is not there rejects with Transport", async () => {
    const server = await startServer();
    const addr = server.addr;
    await server.stop();
    await assert.rejects(SeppClient.connect(addr, { connectTimeoutMs: 2_000 }), (e) => {
      assert.ok(e instanceof TransportError);
      assert.equal(e.retryable, true);
      return true;
    });
  });
});

describe("rejections reported by the server", T, () => {
  /** @type {Awaited<ReturnType<typeof startServer>>} */
  let server;
  /** @type {SeppClient} */
  let client;

  before(async () => {
    server = await startServer({
      server: "strict_queues = true",
      extraToml: [
        "[limits]",
        "max_payload_bytes = 16",
        'allowed_encodings = ["application/json"]',
        "max_custom_entries = 2",
        "max_custom_total_bytes = 64",
        "max_custom_key_bytes = 8",
        "max_queue_name_bytes = 16",
        "max_job_type_bytes = 16",
        "max_schedule_horizon_ms = 60000",
        "",
        "[[queues]]",
        'name = "limited"',
        'allowed_job_types = ["ok"]',
        "",
        "[[queues]]",
        'name = "tiny"',
        "max_queue_depth = 1",
      ].join("\n"),
    });
    client = await SeppClient.connect(server.url);
  });

  after(async () => {
    client?.close();
    await server?.stop();
  });

  const json = (text) => ({ data: Buffer.from(text), encoding: "application/json" });

  test("each limit rejects with its class and details", async () => {
    const cases = [
      [{ queue: "undeclared", jobType: "ok" }, UnknownQueueError, { queue: "undeclared" }],
      [{ queue: "limited", jobType: "nope" }, JobTypeNotAllowedError, { jobType: "nope" }],
      [
        { queue: "limited", jobType: "ok", payload: json('{"a":"0123456789"}') },
        PayloadTooLargeError,
        { limit: 16, actual: 18 },
      ],
      [
        { queue: "limited", jobType: "ok", payload: { data: Buffer.from("x"), encoding: "text" } },
        EncodingNotAllowedError,
        { encoding: "text", allowed: ["application/json"] },
      ],
      [
        { queue: "limited", jobType: "ok", custom: { a: 1, b: 2, c: 3 } },
        CustomEntriesTooManyError,
        { limit: 2, actual: 3 },
      ],
      [
        { queue: "limited", jobType: "ok", custom: { toolongkey: 1 } },
        CustomKeyTooLongError,
        { key: "toolongkey", limit: 8, actual: 10 },
      ],
      [
        { queue: "limited", jobType: "ok", custom: { a: "x".repeat(80) } },
        CustomMapTooLargeError,
        { limit: 64 },
      ],
      [
        { queue: "limited", jobType: "j".repeat(17) },
        JobTypeNameTooLongError,
        { limit: 16, actual: 17 },
      ],
      [
        { queue: "limited", jobType: "ok", scheduledAt: new Date(Date.now() + 3_600_000) },
        ScheduledTooFarError,
        { horizonMs: 60_000 },
      ],
    ];
    for (const [request, Class, details] of cases) {
      await assert.rejects(client.enqueue(request), (e) => {
        assert.ok(e instanceof Class, `${e} is a ${Class.name}`);
        assert.ok(e instanceof JobRejectedError);
        for (const [k, v] of Object.entries(details)) {
          assert.deepEqual(/** @type {any} */ (e)[k], v, `${Class.name}.${k}`);
        }
        return true;
      });
    }
  });

  test("a queue name over the limit rejects with QueueNameTooLongError ", async () => {
    // In strict mode an undeclared name is UnknownQueueError first, so this needs a non-strict
    // server: the default one allows 512 bytes.
    const other = await startServer();
    const c = await SeppClient.connect(other.url);
    try {
      await assert.rejects(c.enqueue({ queue: "q".repeat(513), jobType: "t" }), (e) => {
        assert.ok(e instanceof QueueNameTooLongError);
        assert.equal(e.limit, 512);
        assert.equal(e.actual, 513);
        return true;
      });
    } finally {
      c.close();
      await other.stop();
    }
  });

  test("ScheduledTooFar carries the requested time as a Date", async () => {
    const at = new Date(Date.now() + 3_600_000);
    await assert.rejects(
      client.enqueue({ queue: "limited", jobType: "ok", scheduledAt: at }),
      (e) => e instanceof ScheduledTooFarError && e.actual instanceof Date,
    );
  });

  test("a full queue rejects with QueueFullError, which is retryable", async () => {
    await client.enqueue({ queue: "tiny", jobType: "t" });
    await assert.rejects(client.enqueue({ queue: "tiny", jobType: "t" }), (e) => {
      assert.ok(e instanceof QueueFullError);
      assert.equal(e.queue, "tiny");
      assert.equal(e.limit, 1);
      assert.equal(e.retryable, true);
      return true;
    });
  });

  test("reserve on an undeclared queue in strict mode rejects with FailedPrecondition", async () => {
    await assert.rejects(
      client.reserve({ queues: ["undeclared"], leaseDurationMs: 1_000 }),
      FailedPreconditionError,
    );
  });
});
