// Types of errors.js (hand-written; test/errors.test.js checks them against the core's codes and
// class names).

/** Every stable error code of the core (`errorCodes()` lists them at run time). */
export type ErrorCode =
  | "TRANSPORT"
  | "UNAUTHENTICATED"
  | "PERMISSION_DENIED"
  | "OVERLOADED"
  | "INVALID_ARGUMENT"
  | "FAILED_PRECONDITION"
  | "JOB_NOT_IN_FLIGHT"
  | "ATTEMPT_MISMATCH"
  | "SERVER_FAULT"
  | "UNSUPPORTED"
  | "INVALID_CONFIG"
  | "UNKNOWN_QUEUE"
  | "PAYLOAD_TOO_LARGE"
  | "ENCODING_NOT_ALLOWED"
  | "JOB_TYPE_NOT_ALLOWED"
  | "CUSTOM_ENTRIES_TOO_MANY"
  | "CUSTOM_MAP_TOO_LARGE"
  | "CUSTOM_KEY_TOO_LONG"
  | "QUEUE_NAME_TOO_LONG"
  | "JOB_TYPE_NAME_TOO_LONG"
  | "IDEMPOTENCY_KEY_TOO_LONG"
  | "SCHEDULED_TOO_FAR"
  | "INVALID_REQUEST"
  | "QUEUE_FULL"
  | "QUEUE_CLOSING"
  | "IDEMPOTENCY_KEY_CONFLICT"
  | "TOO_MANY_QUEUES"
  | "UNKNOWN_REJECTION";

/**
 * Base class of every error of sepp. `code` is the core's stable code; `retryable` tells
 * whether the same call may succeed later. Subclasses add the details of their code.
 */
export declare class SeppError extends Error {
  /**
   * @param message what went wrong
   * @param details the code's details (`limit`, `actual`, ...), set as properties
   */
  constructor(message: string, details?: Record<string, unknown>);
  /** The stable code. */
  readonly code: ErrorCode;
  /** Whether the same call may succeed later (transport and overload errors, a full queue). */
  readonly retryable: boolean;
  /** The gRPC status code, when the error came from the server. */
  readonly grpcCode?: number;
}

/** Base class of the codes that refuse one job; in a batch, the value in that job's slot. */
export declare class JobRejectedError extends SeppError {}

/**
 * Base class of the codes that say this delivery's lease is gone (`JOB_NOT_IN_FLIGHT`,
 * `ATTEMPT_MISMATCH`): stop working on the job, it is, or will be, delivered again.
 */
export declare class LeaseLostError extends SeppError {
  /** The job named in the call. */
  readonly jobId: string;
}

// The call failed as a whole.

/** The server could not be reached, or the call was cut off. Retryable. */
export declare class TransportError extends SeppError {
  static readonly code: "TRANSPORT";
  readonly code: "TRANSPORT";
}

/** Missing or wrong API key. Not retryable. */
export declare class UnauthenticatedError extends SeppError {
  static readonly code: "UNAUTHENTICATED";
  readonly code: "UNAUTHENTICATED";
}

/** The API key lacks the role the call needs; the message names it. Not retryable. */
export declare class PermissionDeniedError extends SeppError {
  static readonly code: "PERMISSION_DENIED";
  readonly code: "PERMISSION_DENIED";
}

/** The server sheds load. Retryable after a pause. */
export declare class OverloadedError extends SeppError {
  static readonly code: "OVERLOADED";
  readonly code: "OVERLOADED";
}

/** The request was refused as malformed, by the client before sending or by the server. */
export declare class InvalidArgumentError extends SeppError {
  static readonly code: "INVALID_ARGUMENT";
  readonly code: "INVALID_ARGUMENT";
}

/** Strict mode and an undeclared queue was listed (reserve). */
export declare class FailedPreconditionError extends SeppError {
  static readonly code: "FAILED_PRECONDITION";
  readonly code: "FAILED_PRECONDITION";
}

/** The job is not in flight any more (acked, lease expired, dead-lettered, never existed): the lease is lost. */
export declare class JobNotInFlightError extends LeaseLostError {
  static readonly code: "JOB_NOT_IN_FLIGHT";
  readonly code: "JOB_NOT_IN_FLIGHT";
  /** The job. */
  readonly jobId: string;
}

/** The job is in flight under another attempt: this delivery's lease was lost and the job redelivered. */
export declare class AttemptMismatchError extends LeaseLostError {
  static readonly code: "ATTEMPT_MISMATCH";
  readonly code: "ATTEMPT_MISMATCH";
  /** The job. */
  readonly jobId: string;
}

/** The server failed, or sent an answer this client cannot read. */
export declare class ServerFaultError extends SeppError {
  static readonly code: "SERVER_FAULT";
  readonly code: "SERVER_FAULT";
}

/** The server does not implement the call. */
export declare class UnsupportedError extends SeppError {
  static readonly code: "UNSUPPORTED";
  readonly code: "UNSUPPORTED";
}

/** The url, TLS settings or another connect option is unusable. */
export declare class InvalidConfigError extends SeppError {
  static readonly code: "INVALID_CONFIG";
  readonly code: "INVALID_CONFIG";
}

// One job was refused.

/** Strict mode and the queue is not declared. Has `queue`. */
export declare class UnknownQueueError extends JobRejectedError {
  static readonly code: "UNKNOWN_QUEUE";
  readonly code: "UNKNOWN_QUEUE";
  /** The queue named. */
  readonly queue: string;
}

/** The payload is larger than `limit` bytes. Has `limit`, `actual`. */
export declare class PayloadTooLargeError extends JobRejectedError {
  static readonly code: "PAYLOAD_TOO_LARGE";
  readonly code: "PAYLOAD_TOO_LARGE";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The payload encoding is not allowed. Has `encoding`, `allowed`. */
export declare class EncodingNotAllowedError extends JobRejectedError {
  static readonly code: "ENCODING_NOT_ALLOWED";
  readonly code: "ENCODING_NOT_ALLOWED";
  /** The encoding sent. */
  readonly encoding: string;
  /** Allowed encodings (empty: no payloads at all). */
  readonly allowed: string[];
}

/** The job type is not allowed on the queue. Has `jobType`, `allowed`. */
export declare class JobTypeNotAllowedError extends JobRejectedError {
  static readonly code: "JOB_TYPE_NOT_ALLOWED";
  readonly code: "JOB_TYPE_NOT_ALLOWED";
  /** The job type sent. */
  readonly jobType: string;
  /** Allowed job types. */
  readonly allowed: string[];
}

/** Too many custom entries. Has `limit`, `actual`. */
export declare class CustomEntriesTooManyError extends JobRejectedError {
  static readonly code: "CUSTOM_ENTRIES_TOO_MANY";
  readonly code: "CUSTOM_ENTRIES_TOO_MANY";
  /** Entries allowed. */
  readonly limit: number;
  /** Entries sent. */
  readonly actual: number;
}

/** The custom map is too large. Has `limit`, `actual` (bytes). */
export declare class CustomMapTooLargeError extends JobRejectedError {
  static readonly code: "CUSTOM_MAP_TOO_LARGE";
  readonly code: "CUSTOM_MAP_TOO_LARGE";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes counted. */
  readonly actual: number;
}

/** A custom key is too long. Has `key`, `limit`, `actual` (bytes). */
export declare class CustomKeyTooLongError extends JobRejectedError {
  static readonly code: "CUSTOM_KEY_TOO_LONG";
  readonly code: "CUSTOM_KEY_TOO_LONG";
  /** The key. */
  readonly key: string;
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The queue name is too long. Has `limit`, `actual` (bytes). */
export declare class QueueNameTooLongError extends JobRejectedError {
  static readonly code: "QUEUE_NAME_TOO_LONG";
  readonly code: "QUEUE_NAME_TOO_LONG";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The job type is too long. Has `limit`, `actual` (bytes). */
export declare class JobTypeNameTooLongError extends JobRejectedError {
  static readonly code: "JOB_TYPE_NAME_TOO_LONG";
  readonly code: "JOB_TYPE_NAME_TOO_LONG";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The idempotency key is longer than `limit` UTF-8 bytes; checked before sending. Has `limit`, `actual`. */
export declare class IdempotencyKeyTooLongError extends JobRejectedError {
  static readonly code: "IDEMPOTENCY_KEY_TOO_LONG";
  readonly code: "IDEMPOTENCY_KEY_TOO_LONG";
  /** UTF-8 bytes allowed: the server's `maxIdempotencyKeyBytes` (256 until known). */
  readonly limit: number;
  /** UTF-8 bytes of the key. */
  readonly actual: number;
}

/** `scheduledAt` is beyond the schedule horizon. Has `horizonMs`, `scheduledAt`. */
export declare class ScheduledTooFarError extends JobRejectedError {
  static readonly code: "SCHEDULED_TOO_FAR";
  readonly code: "SCHEDULED_TOO_FAR";
  /** The schedule horizon, in milliseconds. */
  readonly horizonMs: number;
  /** The requested `scheduledAt`. */
  readonly scheduledAt: Date;
  /** @deprecated The requested `scheduledAt`: read `scheduledAt`. */
  readonly actual: Date;
}

/** Structurally invalid (empty name, priority over 9, empty key, invalid Date, ...); the message names the field. */
export declare class InvalidRequestError extends JobRejectedError {
  static readonly code: "INVALID_REQUEST";
  readonly code: "INVALID_REQUEST";
}

/** The queue is full. Transient: `retryable` is true. Has `queue`, `limit`. */
export declare class QueueFullError extends JobRejectedError {
  static readonly code: "QUEUE_FULL";
  readonly code: "QUEUE_FULL";
  /** The queue. */
  readonly queue: string;
  /** Its `max_queue_depth`. */
  readonly limit: number;
}

/** The queue is being deleted. Transient. Has `queue`. */
export declare class QueueClosingError extends JobRejectedError {
  static readonly code: "QUEUE_CLOSING";
  readonly code: "QUEUE_CLOSING";
  /** The queue. */
  readonly queue: string;
}

/**
 * The idempotency key's live record names another job, enqueued with a different job type,
 * payload, encoding, priority or custom map (queues with `key_conflict = "reject"`).
 * Deterministic.
 */
export declare class IdempotencyKeyConflictError extends JobRejectedError {
  static readonly code: "IDEMPOTENCY_KEY_CONFLICT";
  readonly code: "IDEMPOTENCY_KEY_CONFLICT";
  /** The id of the job the key names. */
  readonly originalJobId: string;
}

/**
 * The job's queue does not exist yet and the server holds `limits.max_queues` queues already.
 * Not retried.
 */
export declare class TooManyQueuesError extends JobRejectedError {
  static readonly code: "TOO_MANY_QUEUES";
  readonly code: "TOO_MANY_QUEUES";
  /** The queue the job would have created. */
  readonly queue: string;
  /** The server's `limits.max_queues`. */
  readonly limit: number;
}

/** A rejection this client does not know (a newer server). */
export declare class UnknownRejectionError extends JobRejectedError {
  static readonly code: "UNKNOWN_REJECTION";
  readonly code: "UNKNOWN_REJECTION";
}

/** Every subclass, by its code. */
export declare const errorClasses: {
  readonly TRANSPORT: typeof TransportError;
  readonly UNAUTHENTICATED: typeof UnauthenticatedError;
  readonly PERMISSION_DENIED: typeof PermissionDeniedError;
  readonly OVERLOADED: typeof OverloadedError;
  readonly INVALID_ARGUMENT: typeof InvalidArgumentError;
  readonly FAILED_PRECONDITION: typeof FailedPreconditionError;
  readonly JOB_NOT_IN_FLIGHT: typeof JobNotInFlightError;
  readonly ATTEMPT_MISMATCH: typeof AttemptMismatchError;
  readonly SERVER_FAULT: typeof ServerFaultError;
  readonly UNSUPPORTED: typeof UnsupportedError;
  readonly INVALID_CONFIG: typeof InvalidConfigError;
  readonly UNKNOWN_QUEUE: typeof UnknownQueueError;
  readonly PAYLOAD_TOO_LARGE: typeof PayloadTooLargeError;
  readonly ENCODING_NOT_ALLOWED: typeof EncodingNotAllowedError;
  readonly JOB_TYPE_NOT_ALLOWED: typeof JobTypeNotAllowedError;
  readonly CUSTOM_ENTRIES_TOO_MANY: typeof CustomEntriesTooManyError;
  readonly CUSTOM_MAP_TOO_LARGE: typeof CustomMapTooLargeError;
  readonly CUSTOM_KEY_TOO_LONG: typeof CustomKeyTooLongError;
  readonly QUEUE_NAME_TOO_LONG: typeof QueueNameTooLongError;
  readonly JOB_TYPE_NAME_TOO_LONG: typeof JobTypeNameTooLongError;
  readonly IDEMPOTENCY_KEY_TOO_LONG: typeof IdempotencyKeyTooLongError;
  readonly SCHEDULED_TOO_FAR: typeof ScheduledTooFarError;
  readonly INVALID_REQUEST: typeof InvalidRequestError;
  readonly QUEUE_FULL: typeof QueueFullError;
  readonly QUEUE_CLOSING: typeof QueueClosingError;
  readonly IDEMPOTENCY_KEY_CONFLICT: typeof IdempotencyKeyConflictError;
  readonly TOO_MANY_QUEUES: typeof TooManyQueuesError;
  readonly UNKNOWN_REJECTION: typeof UnknownRejectionError;
};

// Deprecated aliases: the names of earlier releases, the same classes.

/** @deprecated Use `JobRejectedError`. */
export declare const Rejection: typeof JobRejectedError;
/** @deprecated Use `JobRejectedError`. */
export type Rejection = JobRejectedError;
/** @deprecated Use `TransportError`. */
export declare const Transport: typeof TransportError;
/** @deprecated Use `TransportError`. */
export type Transport = TransportError;
/** @deprecated Use `UnauthenticatedError`. */
export declare const Unauthenticated: typeof UnauthenticatedError;
/** @deprecated Use `UnauthenticatedError`. */
export type Unauthenticated = UnauthenticatedError;
/** @deprecated Use `OverloadedError`. */
export declare const Overloaded: typeof OverloadedError;
/** @deprecated Use `OverloadedError`. */
export type Overloaded = OverloadedError;
/** @deprecated Use `InvalidArgumentError`. */
export declare const InvalidArgument: typeof InvalidArgumentError;
/** @deprecated Use `InvalidArgumentError`. */
export type InvalidArgument = InvalidArgumentError;
/** @deprecated Use `FailedPreconditionError`. */
export declare const FailedPrecondition: typeof FailedPreconditionError;
/** @deprecated Use `FailedPreconditionError`. */
export type FailedPrecondition = FailedPreconditionError;
/** @deprecated Use `JobNotInFlightError`. */
export declare const JobNotInFlight: typeof JobNotInFlightError;
/** @deprecated Use `JobNotInFlightError`. */
export type JobNotInFlight = JobNotInFlightError;
/** @deprecated Use `AttemptMismatchError`. */
export declare const AttemptMismatch: typeof AttemptMismatchError;
/** @deprecated Use `AttemptMismatchError`. */
export type AttemptMismatch = AttemptMismatchError;
/** @deprecated Use `ServerFaultError`. */
export declare const ServerFault: typeof ServerFaultError;
/** @deprecated Use `ServerFaultError`. */
export type ServerFault = ServerFaultError;
/** @deprecated Use `UnsupportedError`. */
export declare const Unsupported: typeof UnsupportedError;
/** @deprecated Use `UnsupportedError`. */
export type Unsupported = UnsupportedError;
/** @deprecated Use `InvalidConfigError`. */
export declare const InvalidConfig: typeof InvalidConfigError;
/** @deprecated Use `InvalidConfigError`. */
export type InvalidConfig = InvalidConfigError;
/** @deprecated Use `UnknownQueueError`. */
export declare const UnknownQueue: typeof UnknownQueueError;
/** @deprecated Use `UnknownQueueError`. */
export type UnknownQueue = UnknownQueueError;
/** @deprecated Use `PayloadTooLargeError`. */
export declare const PayloadTooLarge: typeof PayloadTooLargeError;
/** @deprecated Use `PayloadTooLargeError`. */
export type PayloadTooLarge = PayloadTooLargeError;
/** @deprecated Use `EncodingNotAllowedError`. */
export declare const EncodingNotAllowed: typeof EncodingNotAllowedError;
/** @deprecated Use `EncodingNotAllowedError`. */
export type EncodingNotAllowed = EncodingNotAllowedError;
/** @deprecated Use `JobTypeNotAllowedError`. */
export declare const JobTypeNotAllowed: typeof JobTypeNotAllowedError;
/** @deprecated Use `JobTypeNotAllowedError`. */
export type JobTypeNotAllowed = JobTypeNotAllowedError;
/** @deprecated Use `CustomEntriesTooManyError`. */
export declare const CustomEntriesTooMany: typeof CustomEntriesTooManyError;
/** @deprecated Use `CustomEntriesTooManyError`. */
export type CustomEntriesTooMany = CustomEntriesTooManyError;
/** @deprecated Use `CustomMapTooLargeError`. */
export declare const CustomMapTooLarge: typeof CustomMapTooLargeError;
/** @deprecated Use `CustomMapTooLargeError`. */
export type CustomMapTooLarge = CustomMapTooLargeError;
/** @deprecated Use `CustomKeyTooLongError`. */
export declare const CustomKeyTooLong: typeof CustomKeyTooLongError;
/** @deprecated Use `CustomKeyTooLongError`. */
export type CustomKeyTooLong = CustomKeyTooLongError;
/** @deprecated Use `QueueNameTooLongError`. */
export declare const QueueNameTooLong: typeof QueueNameTooLongError;
/** @deprecated Use `QueueNameTooLongError`. */
export type QueueNameTooLong = QueueNameTooLongError;
/** @deprecated Use `JobTypeNameTooLongError`. */
export declare const JobTypeNameTooLong: typeof JobTypeNameTooLongError;
/** @deprecated Use `JobTypeNameTooLongError`. */
export type JobTypeNameTooLong = JobTypeNameTooLongError;
/** @deprecated Use `IdempotencyKeyTooLongError`. */
export declare const IdempotencyKeyTooLong: typeof IdempotencyKeyTooLongError;
/** @deprecated Use `IdempotencyKeyTooLongError`. */
export type IdempotencyKeyTooLong = IdempotencyKeyTooLongError;
/** @deprecated Use `ScheduledTooFarError`. */
export declare const ScheduledTooFar: typeof ScheduledTooFarError;
/** @deprecated Use `ScheduledTooFarError`. */
export type ScheduledTooFar = ScheduledTooFarError;
/** @deprecated Use `InvalidRequestError`. */
export declare const InvalidRequest: typeof InvalidRequestError;
/** @deprecated Use `InvalidRequestError`. */
export type InvalidRequest = InvalidRequestError;
/** @deprecated Use `QueueFullError`. */
export declare const QueueFull: typeof QueueFullError;
/** @deprecated Use `QueueFullError`. */
export type QueueFull = QueueFullError;
/** @deprecated Use `QueueClosingError`. */
export declare const QueueClosing: typeof QueueClosingError;
/** @deprecated Use `QueueClosingError`. */
export type QueueClosing = QueueClosingError;
/** @deprecated Use `UnknownRejectionError`. */
export declare const UnknownRejection: typeof UnknownRejectionError;
/** @deprecated Use `UnknownRejectionError`. */
export type UnknownRejection = UnknownRejectionError;
