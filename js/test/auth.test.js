// A server with API keys: calls without the right key reject with UnauthenticatedError.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InvalidConfigError,
  PermissionDeniedError,
  SeppClient,
  SeppError,
  UnauthenticatedError,
  Worker,
} from "sepp";
import { startServer } from "../test-support/server.js";

describe("api keys", { timeout: 30_000 }, () => {
  /** @type {Awaited<ReturnType<typeof startServer>>} */
  let server;

  before(async () => {
    server = await startServer({
      extraToml:
        '[auth]\napi_keys = [{ name = "t", key = "secret" },' +
        ' { name = "p", key = "producer-only", roles = ["producer"] }]',
    });
  });

  after(() => server?.stop());

  test("connect without a key rejects with Unauthenticated", async () => {
    await assert.rejects(SeppClient.connect(server.url), (e) => {
      assert.ok(e instanceof UnauthenticatedError);
      assert.ok(e instanceof SeppError);
      assert.equal(e.code, "UNAUTHENTICATED");
      assert.equal(e.retryable, false);
      assert.equal(e.grpcCode, 16);
      return true;
    });
  });

  test("connect with a wrong key rejects with Unauthenticated", async () => {
    await assert.rejects(SeppClient.connect(server.url, { apiKey: "wrong" }), UnauthenticatedError);
  });

  test("a key that cannot be sent as a header rejects with InvalidConfig", async () => {
    await assert.rejects(SeppClient.connect(server.url, { apiKey: "bad\nkey" }), InvalidConfigError);
  });

  test("the right key is sent on every call", async () => {
    const client = await SeppClient.connect(server.url, { apiKey: "secret" });
    try {
      const ack = await client.enqueue({ queue: "auth", jobType: "t" });
      assert.equal(ack.deduplicated, false);
      const [job] = await client.reserve({ queues: ["auth"], leaseDurationMs: 5_000 });
      await client.ack(job.id, job.attempt);
    } finally {
      client.close();
    }
  });

  test("a worker whose key lacks the worker role rejects instead of waiting for jobs", async () => {
    const admin = await SeppClient.connect(server.url, { apiKey: "secret" });
    const producer = await SeppClient.connect(server.url, { apiKey: "producer-only" });
    try {
      const ack = await admin.enqueue({ queue: "auth-roles", jobType: "t" });
      const worker = new Worker(producer, { queues: ["auth-roles"], handleSignals: false });
      worker.handle("t", async () => {
        throw new Error("no job can be reserved with this key");
      });
      await assert.rejects(worker.run(), (e) => {
        assert.ok(e instanceof PermissionDeniedError, String(e));
        assert.match(e.message, /worker/);
        return true;
      });
      const info = await admin.getJob(ack.jobId);
      assert.equal(info.state, "ready");
      assert.equal(info.attempt, 0);
    } finally {
      producer.close();
      admin.close();
    }
  });
});
