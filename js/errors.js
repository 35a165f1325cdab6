// Errors of the `sepp` package: `SeppError` and one subclass per stable code of the Rust core
// (`ErrorCode::ALL` in core/src/error.rs; `errorCodes()` lists them at run time), each named
// for its code as in Python: `<PascalCode>Error` (`errorClassNames()`, the core's table). The
// native module rejects with plain `Error`s carrying `code` and the code's details; bridge.js
// turns each into its class. test/errors.test.js checks this file and errors.d.ts against the
// core. The names of earlier releases (`Transport`, `QueueFull`, `Rejection`, ...) remain as
// deprecated aliases at the end.

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
export class JobRejectedError extends SeppError {}

/**
 * Base class of the codes that say this delivery's lease is gone (`JOB_NOT_IN_FLIGHT`,
 * `ATTEMPT_MISMATCH`): stop working on the job, it is, or will be, delivered again. Has `jobId`.
 */
export class LeaseLostError extends SeppError {}

// The call failed as a whole.

/** The server could not be reached, or the call was cut off. Retryable. */
export class TransportError extends SeppError {
  static code = "TRANSPORT";
}

/** Missing or wrong API key. Not retryable. */
export class UnauthenticatedError extends SeppError {
  static code = "UNAUTHENTICATED";
}

/** The API key lacks the role the call needs; the message names it. Not retryable. */
export class PermissionDeniedError extends SeppError {
  static code = "PERMISSION_DENIED";
}

/** The server sheds load. Retryable after a pause. */
export class OverloadedError extends SeppError {
  static code = "OVERLOADED";
}

/** The request was refused as malformed, by the client before sending or by the server. */
export class InvalidArgumentError extends SeppError {
  static code = "INVALID_ARGUMENT";
}

/** Strict mode and an undeclared queue was listed (reserve). */
export class FailedPreconditionError extends SeppError {
  static code = "FAILED_PRECONDITION";
}

/** The job is not in flight any more (acked, lease expired, dead-lettered, never existed): the lease is lost. */
export class JobNotInFlightError extends LeaseLostError {
  static code = "JOB_NOT_IN_FLIGHT";
}

/** The job is in flight under another attempt: this delivery's lease was lost and the job redelivered. */
export class AttemptMismatchError extends LeaseLostError {
  static code = "ATTEMPT_MISMATCH";
}

/** The server failed, or sent an answer this client cannot read. */
export class ServerFaultError extends SeppError {
  static code = "SERVER_FAULT";
}

/** The server does not implement the call. */
export class UnsupportedError extends SeppError {
  static code = "UNSUPPORTED";
}

/** The url, TLS settings or another connect option is unusable. */
export class InvalidConfigError extends SeppError {
  static code = "INVALID_CONFIG";
}

// One job was refused.

/** Strict mode and the queue is not declared. Has `queue`. */
export class UnknownQueueError extends JobRejectedError {
  static code = "UNKNOWN_QUEUE";
}

/** The payload is larger than `limit` bytes. Has `limit`, `actual`. */
export class PayloadTooLargeError extends JobRejectedError {
  static code = "PAYLOAD_TOO_LARGE";
}

/** The payload encoding is not allowed. Has `encoding`, `allowed`. */
export class EncodingNotAllowedError extends JobRejectedError {
  static code = "ENCODING_NOT_ALLOWED";
}

/** The job type is not allowed on the queue. Has `jobType`, `allowed`. */
export class JobTypeNotAllowedError extends JobRejectedError {
  static code = "JOB_TYPE_NOT_ALLOWED";
}

/** Too many custom entries. Has `limit`, `actual`. */
export class CustomEntriesTooManyError extends JobRejectedError {
  static code = "CUSTOM_ENTRIES_TOO_MANY";
}

/** The custom map is too large. Has `limit`, `actual` (bytes). */
export class CustomMapTooLargeError extends JobRejectedError {
  static code = "CUSTOM_MAP_TOO_LARGE";
}

/** A custom key is too long. Has `key`, `limit`, `actual` (bytes). */
export class CustomKeyTooLongError extends JobRejectedError {
  static code = "CUSTOM_KEY_TOO_LONG";
}

/** The queue name is too long. Has `limit`, `actual` (bytes). */
export class QueueNameTooLongError extends JobRejectedError {
  static code = "QUEUE_NAME_TOO_LONG";
}

/** The job type is too long. Has `limit`, `actual` (bytes). */
export class JobTypeNameTooLongError extends JobRejectedError {
  static code = "JOB_TYPE_NAME_TOO_LONG";
}

/** The idempotency key is longer than `limit` UTF-8 bytes; checked before sending. Has `limit`, `actual`. */
export class IdempotencyKeyTooLongError extends JobRejectedError {
  static code = "IDEMPOTENCY_KEY_TOO_LONG";
}

/** `scheduledAt` is beyond the schedule horizon. Has `horizonMs`, `scheduledAt`. */
export class ScheduledTooFarError extends JobRejectedError {
  static code = "SCHEDULED_TOO_FAR";
}

/** Structurally invalid (empty name, priority over 9, empty key, invalid Date, ...); the message names the field. */
export class InvalidRequestError extends JobRejectedError {
  static code = "INVALID_REQUEST";
}

/** The queue is full. Transient: `retryable` is true. Has `queue`, `limit`. */
export class QueueFullError extends JobRejectedError {
  static code = "QUEUE_FULL";
}

/** The queue is being deleted. Transient. Has `queue`. */
export class QueueClosingError extends JobRejectedError {
  static code = "QUEUE_CLOSING";
}

/**
 * The idempotency key's live record names another job, enqueued with a different job type,
 * payload, encoding, priority or custom map (queues with `key_conflict = "reject"`).
 * Deterministic. Has `originalJobId`.
 */
export class IdempotencyKeyConflictError extends JobRejectedError {
  static code = "IDEMPOTENCY_KEY_CONFLICT";
}

/**
 * The job's queue does not exist yet and the server holds `limits.max_queues` queues already.
 * Not retried. Has `queue`, `limit`.
 */
export class TooManyQueuesError extends JobRejectedError {
  static code = "TOO_MANY_QUEUES";
}

/** A rejection this client does not know (a newer server). */
export class UnknownRejectionError extends JobRejectedError {
  static code = "UNKNOWN_REJECTION";
}

/** Every subclass, by its code. */
export const errorClasses = Object.freeze({
  TRANSPORT: TransportError,
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  OVERLOADED: OverloadedError,
  INVALID_ARGUMENT: InvalidArgumentError,
  FAILED_PRECONDITION: FailedPreconditionError,
  JOB_NOT_IN_FLIGHT: JobNotInFlightError,
  ATTEMPT_MISMATCH: AttemptMismatchError,
  SERVER_FAULT: ServerFaultError,
  UNSUPPORTED: UnsupportedError,
  INVALID_CONFIG: InvalidConfigError,
  UNKNOWN_QUEUE: UnknownQueueError,
  PAYLOAD_TOO_LARGE: PayloadTooLargeError,
  ENCODING_NOT_ALLOWED: EncodingNotAllowedError,
  JOB_TYPE_NOT_ALLOWED: JobTypeNotAllowedError,
  CUSTOM_ENTRIES_TOO_MANY: CustomEntriesTooManyError,
  CUSTOM_MAP_TOO_LARGE: CustomMapTooLargeError,
  CUSTOM_KEY_TOO_LONG: CustomKeyTooLongError,
  QUEUE_NAME_TOO_LONG: QueueNameTooLongError,
  JOB_TYPE_NAME_TOO_LONG: JobTypeNameTooLongError,
  IDEMPOTENCY_KEY_TOO_LONG: IdempotencyKeyTooLongError,
  SCHEDULED_TOO_FAR: ScheduledTooFarError,
  INVALID_REQUEST: InvalidRequestError,
  QUEUE_FULL: QueueFullError,
  QUEUE_CLOSING: QueueClosingError,
  IDEMPOTENCY_KEY_CONFLICT: IdempotencyKeyConflictError,
  TOO_MANY_QUEUES: TooManyQueuesError,
  UNKNOWN_REJECTION: UnknownRejectionError,
});

// Deprecated aliases: the names of earlier releases, the same classes.

/** @deprecated Use `JobRejectedError`. */
export const Rejection = JobRejectedError;
/** @deprecated Use `TransportError`. */
export const Transport = TransportError;
/** @deprecated Use `UnauthenticatedError`. */
export const Unauthenticated = UnauthenticatedError;
/** @deprecated Use `OverloadedError`. */
export const Overloaded = OverloadedError;
/** @deprecated Use `InvalidArgumentError`. */
export const InvalidArgument = InvalidArgumentError;
/** @deprecated Use `FailedPreconditionError`. */
export const FailedPrecondition = FailedPreconditionError;
/** @deprecated Use `JobNotInFlightError`. */
export const JobNotInFlight = JobNotInFlightError;
/** @deprecated Use `AttemptMismatchError`. */
export const AttemptMismatch = AttemptMismatchError;
/** @deprecated Use `ServerFaultError`. */
export const ServerFault = ServerFaultError;
/** @deprecated Use `UnsupportedError`. */
export const Unsupported = UnsupportedError;
/** @deprecated Use `InvalidConfigError`. */
export const InvalidConfig = InvalidConfigError;
/** @deprecated Use `UnknownQueueError`. */
export const UnknownQueue = UnknownQueueError;
/** @deprecated Use `PayloadTooLargeError`. */
export const PayloadTooLarge = PayloadTooLargeError;
/** @deprecated Use `EncodingNotAllowedError`. */
export const EncodingNotAllowed = EncodingNotAllowedError;
/** @deprecated Use `JobTypeNotAllowedError`. */
export const JobTypeNotAllowed = JobTypeNotAllowedError;
/** @deprecated Use `CustomEntriesTooManyError`. */
export const CustomEntriesTooMany = CustomEntriesTooManyError;
/** @deprecated Use `CustomMapTooLargeError`. */
export const CustomMapTooLarge = CustomMapTooLargeError;
/** @deprecated Use `CustomKeyTooLongError`. */
export const CustomKeyTooLong = CustomKeyTooLongError;
/** @deprecated Use `QueueNameTooLongError`. */
export const QueueNameTooLong = QueueNameTooLongError;
/** @deprecated Use `JobTypeNameTooLongError`. */
export const JobTypeNameTooLong = JobTypeNameTooLongError;
/** @deprecated Use `IdempotencyKeyTooLongError`. */
export const IdempotencyKeyTooLong = IdempotencyKeyTooLongError;
/** @deprecated Use `ScheduledTooFarError`. */
export const ScheduledTooFar = ScheduledTooFarError;
/** @deprecated Use `InvalidRequestError`. */
export const InvalidRequest = InvalidRequestError;
/** @deprecated Use `QueueFullError`. */
export const QueueFull = QueueFullError;
/** @deprecated Use `QueueClosingError`. */
export const QueueClosing = QueueClosingError;
/** @deprecated Use `UnknownRejectionError`. */
export const UnknownRejection = UnknownRejectionError;
