// `Engine`: the public wrapper over the native engine (index.js), as `SeppClient` in sepp.js is
// over the native client. It takes a public `SeppClient` and turns the native module's errors
// into `SeppError` subclasses; everything else (the whole worker policy: reserve batching,
// lease keeping and loss, job types without a handler, handler timeouts, drain, counts) is the
// Rust core's. Methods, order and documentation: `Engine` in index.d.ts. Leases pass through
// unchanged: `Lease.lost()` and `Lease.done()` never reject.

import { call, fromNative, native, nativeClient } from "./bridge.js";

/** Guards the constructor: engines come from `Engine.start`. */
const fromStart = Symbol("Engine.start");

/** @typedef {import("./index.js").Engine} NativeEngine */

export class Engine {
  /** @type {NativeEngine} */
  #native;

  /**
   * Use `await Engine.start(client, options)`.
   * @param {symbol} token
   * @param {NativeEngine} nativeEngine
   */
  constructor(token, nativeEngine) {
    if (token !== fromStart) {
      throw new TypeError("use `await Engine.start(client, options)` to create an Engine");
    }
    this.#native = nativeEngine;
  }

  /**
   * @param {import("./sepp.js").SeppClient} client
   * @param {import("./index.js").EngineOptions} options
   */
  static async start(client, options) {
    const engine = await call(() => native.Engine.start(nativeClient(client, "client"), options));
    return new Engine(fromStart, engine);
  }

  next() {
    return call(() => this.#native.next());
  }

  /**
   * @param {string} jobId
   * @param {number} attempt
   * @param {import("./index.js").Outcome} outcome
   */
  settle(jobId, attempt, outcome) {
    return call(() => this.#native.settle(jobId, attempt, outcome));
  }

  /**
   * @deprecated Use `settle`.
   * @param {string} jobId
   * @param {number} attempt
   * @param {import("./index.js").Outcome} outcome
   */
  complete(jobId, attempt, outcome) {
    return this.settle(jobId, attempt, outcome);
  }

  shutdown() {
    this.#native.shutdown();
  }

  get isShutDown() {
    return this.#native.isShutDown;
  }

  get inFlight() {
    return this.#native.inFlight;
  }

  stopNotice() {
    return this.#native.stopNotice();
  }

  failure() {
    const err = this.#native.failure();
    return err === null ? null : fromNative(err);
  }

  /** @param {number} timeoutMs */
  waitIdle(timeoutMs) {
    return call(() => this.#native.waitIdle(timeoutMs));
  }

  drain() {
    return call(() => this.#native.drain());
  }

  endGracePeriod() {
    this.#native.endGracePeriod();
  }

  get report() {
    return this.#native.report;
  }

  /** @param {string} reason */
  abandonAll(reason) {
    return call(() => this.#native.abandonAll(reason));
  }
}
