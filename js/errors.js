// Errors of the `sepp` package: `SeppError` and one subclass per stable code of the Rust core
// (`ErrorCode::ALL` in core/src/error.rs; `errorCodes()` lists them at run time). The native
// module rejects with plain `Error`s carrying `code` and the code's details; bridge.js turns
// each into its class. test/errors.test.js checks this file and errors.d.ts against the core.

/**
 * Base class of every error of sepp. `code` is the core's stable code; `retryable` tells
 * whether the same call may succeed later. Subclasses add the details of their code.
 */
export class SeppError extends Error {
  /**
   * @param {string} message
   * @param {Record<string, unknown>} [details] the code's details (`limit`, `actual`, ...)
   */
  constructor(message, details = {}) {
    super(message);
    const { code, retryable, message: _m, name: _n, stack: _s, ...rest } = details;
    Object.assign(this, rest);
    this.name = new.target.name;
    this.code = /** @type {{ code?: string }} */ (new.target).code ?? code;
    this.retryable = Boolean(retryable);
  }
}

/** Base class of the codes that refuse one job; in a batch, the value in that job's slot. */
export class Rejection extends SeppError {}

// The call failed as a whole.

/** The server could not be reached, or the call was cut off. Retryable. */
export class Transport extends SeppError {
  static code = "TRANSPORT";
}

/** Missing or wrong API key. Not retryable. */
export class Unauthenticated extends SeppError {
  static code = "UNAUTHENTICATED";
}

/** The server sheds load. Retryable after a pause. */
export class Overloaded extends SeppError {
  static code = "OVERLOADED";
}

/** The request was refused as malformed, by the client before sending or by the server. */
export class InvalidArgument extends SeppError {
  static code = "INVALID_ARGUMENT";
}

/** Strict mode and an undeclared queue was listed (reserve). */
export class FailedPrecondition extends SeppError {
  static code = "FAILED_PRECONDITION";
}

/** The job is not in flight any more (acked, lease expired, dead-lettered, never existed): the lease is lost. */
export class JobNotInFlight extends SeppError {
  static code = "JOB_NOT_IN_FLIGHT";
}

/** The job is in flight under another attempt: this delivery's lease was lost and the job redelivered. */
export class AttemptMismatch extends SeppError {
  static code = "ATTEMPT_MISMATCH";
}

/** The server failed, or sent an answer this client cannot read. */
export class ServerFault extends SeppError {
  static code = "SERVER_FAULT";
}

/** The server does not implement the call. */
export class Unsupported extends SeppError {
  static code = "UNSUPPORTED";
}

/** The url, TLS settings or another connect option is unusable. */
export class InvalidConfig extends SeppError {
  static code = "INVALID_CONFIG";
}

// One job was refused.

/** Strict mode and the queue is not declared. Has `queue`. */
export class UnknownQueue extends Rejection {
  static code = "UNKNOWN_QUEUE";
}

/** The payload is larger than `limit` bytes. Has `limit`, `actual`. */
export class PayloadTooLarge extends Rejection {
  static code = "PAYLOAD_TOO_LARGE";
}

/** The payload encoding is not allowed. Has `encoding`, `allowed`. */
export class EncodingNotAllowed extends Rejection {
  static code = "ENCODING_NOT_ALLOWED";
}

/** The job type is not allowed on the queue. Has `jobType`, `allowed`. */
export class JobTypeNotAllowed extends Rejection {
  static code = "JOB_TYPE_NOT_ALLOWED";
}

/** Too many custom entries. Has `limit`, `actual`. */
export class CustomEntriesTooMany extends Rejection {
  static code = "CUSTOM_ENTRIES_TOO_MANY";
}

/** The custom map is too large. Has `limit`, `actual` (bytes). */
export class CustomMapTooLarge extends Rejection {
  static code = "CUSTOM_MAP_TOO_LARGE";
}

/** A custom key is too long. Has `key`, `limit`, `actual` (bytes). */
export class CustomKeyTooLong extends Rejection {
  static code = "CUSTOM_KEY_TOO_LONG";
}

/** The queue name is too long. Has `limit`, `actual` (bytes). */
export class QueueNameTooLong extends Rejection {
  static code = "QUEUE_NAME_TOO_LONG";
}

/** The job type is too long. Has `limit`, `actual` (bytes). */
export class JobTypeNameTooLong extends Rejection {
  static code = "JOB_TYPE_NAME_TOO_LONG";
}

/** The idempotency key is longer than `limit` UTF-8 bytes; checked before sending. Has `limit`, `actual`. */
export class IdempotencyKeyTooLong extends Rejection {
  static code = "IDEMPOTENCY_KEY_TOO_LONG";
}

/** `scheduledAt` is beyond the schedule horizon. Has `horizonMs`, `actual` (a Date). */
export class ScheduledTooFar extends Rejection {
  static code = "SCHEDULED_TOO_FAR";
}

/** Structurally invalid (empty name, priority over 9, empty key, invalid Date, ...); the message names the field. */
export class InvalidRequest extends Rejection {
  static code = "INVALID_REQUEST";
}

/** The queue is full. Transient: `retryable` is true. Has `queue`, `limit`. */
export class QueueFull extends Rejection {
  static code = "QUEUE_FULL";
}

/** The queue is being deleted. Transient. Has `queue`. */
export class QueueClosing extends Rejection {
  static code = "QUEUE_CLOSING";
}

/** A rejection this client does not know (a newer server). */
export class UnknownRejection extends Rejection {
  static code = "UNKNOWN_REJECTION";
}

/** Every subclass, by its code. */
export const errorClasses = Object.freeze({
  TRANSPORT: Transport,
  UNAUTHENTICATED: Unauthenticated,
  OVERLOADED: Overloaded,
  INVALID_ARGUMENT: InvalidArgument,
  FAILED_PRECONDITION: FailedPrecondition,
  JOB_NOT_IN_FLIGHT: JobNotInFlight,
  ATTEMPT_MISMATCH: AttemptMismatch,
  SERVER_FAULT: ServerFault,
  UNSUPPORTED: Unsupported,
  INVALID_CONFIG: InvalidConfig,
  UNKNOWN_QUEUE: UnknownQueue,
  PAYLOAD_TOO_LARGE: PayloadTooLarge,
  ENCODING_NOT_ALLOWED: EncodingNotAllowed,
  JOB_TYPE_NOT_ALLOWED: JobTypeNotAllowed,
  CUSTOM_ENTRIES_TOO_MANY: CustomEntriesTooMany,
  CUSTOM_MAP_TOO_LARGE: CustomMapTooLarge,
  CUSTOM_KEY_TOO_LONG: CustomKeyTooLong,
  QUEUE_NAME_TOO_LONG: QueueNameTooLong,
  JOB_TYPE_NAME_TOO_LONG: JobTypeNameTooLong,
  IDEMPOTENCY_KEY_TOO_LONG: IdempotencyKeyTooLong,
  SCHEDULED_TOO_FAR: ScheduledTooFar,
  INVALID_REQUEST: InvalidRequest,
  QUEUE_FULL: QueueFull,
  QUEUE_CLOSING: QueueClosing,
  UNKNOWN_REJECTION: UnknownRejection,
});

