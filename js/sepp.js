// The public entry of the `sepp` package (ESM; sepp.cjs gives CommonJS the same module).
//
// Everything is re-exported from the generated native loader (index.js: types, `errorCodes`,
// `Lease`), errors.js and worker.js; `SeppClient` (here) and `Engine` (engine.js) are
// re-declared as thin wrappers over the native classes whose only job is to turn the native
// module's errors into `SeppError` subclasses. Their methods are those of the native classes,
// in the same order, with the same arguments and results; their documentation (index.d.ts) is
// generated from the Rust doc comments in bindings/node. A named export takes precedence over
// the `export *` of index.js, so `Engine` is the wrapper.

import { call, fromNative, native, nativeClients } from "./bridge.js";
import { currentTraceContext } from "./tracing.js";

export * from "./index.js";
export * from "./errors.js";
export { Engine } from "./engine.js";
export * from "./worker.js";

/** Guards the constructor: clients come from `SeppClient.connect`. */
const fromConnect = Symbol("SeppClient.connect");

/** @typedef {import("./index.js").SeppClient} NativeClient */

export class SeppClient {
  /** @type {NativeClient} */
  #native;

  /**
   * Use `await SeppClient.connect(url, options)`.
   * @param {symbol} token
   * @param {NativeClient} nativeClient
   */
  constructor(token, nativeClient) {
    if (token !== fromConnect) {
      throw new TypeError("use `await SeppClient.connect(url, options)` to create a SeppClient");
    }
    this.#native = nativeClient;
    nativeClients.set(this, nativeClient);
  }

  /**
   * @param {string} url
   * @param {import("./index.js").ConnectOptions} [options]
   */
  static async connect(url, options) {
    const client = await call(() => native.SeppClient.connect(url, options));
    return new SeppClient(fromConnect, client);
  }

  close() {
    this.#native.close();
  }

  /** @param {import("./index.js").EnqueueRequest} request */
  enqueue(request) {
    return call(() => this.#native.enqueue(request, ...currentTraceContext()));
  }

  /** @param {import("./index.js").EnqueueRequest[]} requests */
  async enqueueBatch(requests) {
    const results = await call(() => this.#native.enqueueBatch(requests, ...currentTraceContext()));
    for (const r of results) {
      if (r.status === "rejected") r.error = /** @type {any} */ (fromNative(r.error));
    }
    return results;
  }

  /** @param {import("./index.js").EnqueueRequest[]} requests */
  async enqueueAtomic(requests) {
    const result = await call(() => this.#native.enqueueAtomic(requests, ...currentTraceContext()));
    if (result.status === "rejected") {
      for (const f of result.failures) f.error = /** @type {any} */ (fromNative(f.error));
    }
    return result;
  }

  /** @param {import("./index.js").ReserveOptions} options */
  reserve(options) {
    return call(() => this.#native.reserve(options));
  }

  /**
   * @param {string} jobId
   * @param {number} attempt
   */
  ack(jobId, attempt) {
    return call(() => this.#native.ack(jobId, attempt));
  }

  /**
   * @param {string} jobId
   * @param {number} attempt
   * @param {import("./index.js").ReserveOptions} next
   */
  ackThenReserve(jobId, attempt, next) {
    return call(() => this.#native.ackThenReserve(jobId, attempt, next));
  }

  /**
   * @param {string} jobId
   * @param {number} attempt
   * @param {import("./index.js").NackOptions} [options]
   */
  nack(jobId, attempt, options) {
    return call(() => this.#native.nack(jobId, attempt, options));
  }

  /**
   * @param {string} jobId
   * @param {number} attempt
   * @param {number} leaseDurationMs
   */
  extend(jobId, attempt, leaseDurationMs) {
    return call(() => this.#native.extend(jobId, attempt, leaseDurationMs));
  }

  /** @param {import("./index.js").DrainDeadLettersOptions} options */
  drainDeadLetters(options) {
    return call(() => this.#native.drainDeadLetters(options));
  }

  getServerInfo() {
    return call(() => this.#native.getServerInfo());
  }

  // Operator calls (sepp.admin.v1).

  /** @param {string} jobId */
  getJob(jobId) {
    return call(() => this.#native.getJob(jobId));
  }

  /**
   * @param {string} queue
   * @param {string} key
   */
  lookupIdempotencyKey(queue, key) {
    return call(() => this.#native.lookupIdempotencyKey(queue, key));
  }

  /** @param {import("./index.js").ListDeadLettersOptions} [options] */
  listDeadLetters(options) {
    return call(() => this.#native.listDeadLetters(options));
  }

  /** @param {{ jobIds: string[] } | { queue?: string; max: number }} selector */
  requeueDeadLetters(selector) {
    return call(() => this.#native.requeueDeadLetters(selector));
  }

  /** @param {{ jobIds: string[] } | { queue?: string; max: number }} selector */
  deleteDeadLetters(selector) {
    return call(() => this.#native.deleteDeadLetters(selector));
  }

  /** @param {string} queue */
  pauseQueue(queue) {
    return call(() => this.#native.pauseQueue(queue));
  }

  /** @param {string} queue */
  resumeQueue(queue) {
    return call(() => this.#native.resumeQueue(queue));
  }

  /** @param {string} queue */
  getQueueStats(queue) {
    return call(() => this.#native.getQueueStats(queue));
  }
}
