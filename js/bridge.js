// Internal: the bridge between the native module (index.js, generated) and the public classes.
// Not exported from the package. A later worker.js drives the native module through it too.

import { errorClasses } from "./errors.js";

export * as native from "./index.js";

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
