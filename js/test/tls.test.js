// Mutual TLS: a server with `server.tls_client_ca_path` serves a client whose certificate that
// CA signed and refuses, at the handshake, one without a certificate or with another CA's
// (TransportError). The certificates are the committed test set server/tests/fixtures/tls/
// (its README), shared with the Rust and Python tests.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { InvalidConfigError, SeppClient, SeppError, TransportError } from "sepp";
import { startServer } from "../test-support/server.js";

const fixtures = resolve(dirname(fileURLToPath(import.meta.url)), "../../server/tests/fixtures/tls");
const pem = (/** @type {string} */ name) => readFileSync(join(fixtures, name), "utf8");

describe("mutual TLS", { timeout: 30_000 }, () => {
  /** @type {Awaited<ReturnType<typeof startServer>>} */
  let server;

  before(async () => {
    server = await startServer({
      server: [
        `tls_cert_path = ${JSON.stringify(join(fixtures, "server.pem"))}`,
        `tls_key_path = ${JSON.stringify(join(fixtures, "server.key"))}`,
        `tls_client_ca_path = ${JSON.stringify(join(fixtures, "client-ca.pem"))}`,
      ].join("\n"),
    });
  });

  after(() => server?.stop());

  /** @param {{ clientCertPem?: string, clientKeyPem?: string }} [identity] */
  const connect = (identity = {}) =>
    SeppClient.connect(`https://${server.addr}`, {
      tls: { caPem: pem("server.pem"), domain: "localhost", ...identity },
      rpcTimeoutMs: 10_000,
      retryPolicy: null,
    });

  test("a client certificate signed by the client CA is served", async () => {
    const client = await connect({ clientCertPem: pem("client.pem"), clientKeyPem: pem("client.key") });
    try {
      const ack = await client.enqueue({ queue: "mtls", jobType: "t" });
      const job = await client.getJob(ack.jobId);
      assert.equal(job.queue, "mtls");
    } finally {
      client.close();
    }
  });

  test("a client without a certificate is refused with TransportError", async () => {
    await assert.rejects(connect(), (e) => {
      assert.ok(e instanceof TransportError, String(e));
      assert.ok(e instanceof SeppError);
      assert.equal(e.code, "TRANSPORT");
      return true;
    });
  });

  test("a certificate of another CA is refused with TransportError", async () => {
    await assert.rejects(
      connect({ clientCertPem: pem("other-client.pem"), clientKeyPem: pem("other-client.key") }),
      TransportError,
    );
  });

  test("a client certificate without its key is InvalidConfig", async () => {
    await assert.rejects(connect({ clientCertPem: pem("client.pem") }), (e) => {
      assert.ok(e instanceof InvalidConfigError, String(e));
      assert.match(e.message, /clientKeyPem|client_key_pem/);
      return true;
    });
  });
});
