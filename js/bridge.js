// Internal: the bridge between the native module (index.js, generated) and the public classes
// (sepp.js, engine.js, worker.js). Not exported from the package.

import { errorClasses } from "./errors.js";

export * as native from "./index.js";

/**
 * The native client under each public `SeppClient` (set by its constructor), so that
 * `Engine.start` can hand the native one to the native engine. A WeakMap, so it keeps no
 * client alive.
 * @type {WeakMap<object, import("./index.js").SeppClient>}
 */
export const nativeClients = new WeakMap();

/**
 * The native client under `client`, or a `TypeError` (code `ERR_INVALID_ARG_TYPE`) naming
 * `name` when `client` is not a `SeppClient` of this package.
 * @param {unknown} client
 * @param {string} name
 */
export function nativeClient(client, name) {
  const found = typeof client === "object" && client !== null ? nativeClients.get(client) : undefined;
  if (found === undefined) {
    const err = new TypeError(`${name} must be a SeppClient (from \`await SeppClient.connect(url)\`)`);
    Object.assign(err, { code: "ERR_INVALID_ARG_TYPE" });
    throw err;
  }
  return found;
}

/**
 * The `SeppError` subclass instance for an error of the native module, picked by its `code`;
 * any other value (a `TypeError`, a closed client's error, a code this file does not know) is
 * returned as it is.
 * @param {unknown} err
 * @returns {unknown}
 */
export function fromNative(err) {
  if (!(err instanceof Error)) return err;
  const code = /** @type {{ code?: unknown }} */ (err).code;
  if (typeof code !== "string" || !Object.hasOwn(errorClasses, code)) return err;
  const Class = errorClasses[/** @type {keyof typeof errorClasses} */ (code)];
  return new Class(err.message, { ...err });
}

/**
 * Awaits `work()` (a native call) and re-throws its error as the matching `SeppError`.
 * A synchronous throw becomes a rejection too.
 * @template T
 * @param {() => Promise<T>} work
 * @returns {Promise<T>}
 */
export async function call(work) {
  try {
    return await work();
  } catch (err) {
    throw fromNative(err);
  }
}
