// CommonJS consumers: require("sepp") gives the same module as import, so instanceof works
// across both.

const assert = require("node:assert/strict");
const { test } = require("node:test");

test("require('sepp') exposes the client, the worker and the error classes", async () => {
  const sepp = require("sepp");
  assert.equal(typeof sepp.SeppClient.connect, "function");
  assert.equal(typeof sepp.errorCodes, "function");
  assert.ok(new sepp.IdempotencyKeyTooLong("m") instanceof sepp.SeppError);
  const esm = await import("sepp");
  assert.equal(sepp.SeppClient, esm.SeppClient);
  assert.equal(sepp.IdempotencyKeyTooLong, esm.IdempotencyKeyTooLong);
  assert.equal(sepp.Worker, esm.Worker);
  assert.equal(sepp.HandlerError, esm.HandlerError);
  assert.equal(sepp.Engine, esm.Engine);
  assert.ok(sepp.HandlerError.retry() instanceof esm.HandlerError);
});
