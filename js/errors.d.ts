// Types of errors.js (hand-written; test/errors.test.js checks them against the core's codes).

/** Every stable error code of the core (`errorCodes()` lists them at run time). */
export type ErrorCode =
  | "TRANSPORT"
  | "UNAUTHENTICATED"
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
export declare class Rejection extends SeppError {}

// The call failed as a whole.

/** The server could not be reached, or the call was cut off. Retryable. */
export declare class Transport extends SeppError {
  static readonly code: "TRANSPORT";
  readonly code: "TRANSPORT";
}

/** Missing or wrong API key. Not retryable. */
export declare class Unauthenticated extends SeppError {
  static readonly code: "UNAUTHENTICATED";
  readonly code: "UNAUTHENTICATED";
}

/** The server sheds load. Retryable after a pause. */
export declare class Overloaded extends SeppError {
  static readonly code: "OVERLOADED";
  readonly code: "OVERLOADED";
}

/** The request was refused as malformed, by the client before sending or by the server. */
export declare class InvalidArgument extends SeppError {
  static readonly code: "INVALID_ARGUMENT";
  readonly code: "INVALID_ARGUMENT";
}

/** Strict mode and an undeclared queue was listed (reserve). */
export declare class FailedPrecondition extends SeppError {
  static readonly code: "FAILED_PRECONDITION";
  readonly code: "FAILED_PRECONDITION";
}

/** The job is not in flight any more (acked, lease expired, dead-lettered, never existed): the lease is lost. */
export declare class JobNotInFlight extends SeppError {
  static readonly code: "JOB_NOT_IN_FLIGHT";
  readonly code: "JOB_NOT_IN_FLIGHT";
  /** The job. */
  readonly jobId: string;
}

/** The job is in flight under another attempt: this delivery's lease was lost and the job redelivered. */
export declare class AttemptMismatch extends SeppError {
  static readonly code: "ATTEMPT_MISMATCH";
  readonly code: "ATTEMPT_MISMATCH";
  /** The job. */
  readonly jobId: string;
}

/** The server failed, or sent an answer this client cannot read. */
export declare class ServerFault extends SeppError {
  static readonly code: "SERVER_FAULT";
  readonly code: "SERVER_FAULT";
}

/** The server does not implement the call. */
export declare class Unsupported extends SeppError {
  static readonly code: "UNSUPPORTED";
  readonly code: "UNSUPPORTED";
}

/** The url, TLS settings or another connect option is unusable. */
export declare class InvalidConfig extends SeppError {
  static readonly code: "INVALID_CONFIG";
  readonly code: "INVALID_CONFIG";
}

// One job was refused.

/** Strict mode and the queue is not declared. Has `queue`. */
export declare class UnknownQueue extends Rejection {
  static readonly code: "UNKNOWN_QUEUE";
  readonly code: "UNKNOWN_QUEUE";
  /** The queue named. */
  readonly queue: string;
}

/** The payload is larger than `limit` bytes. Has `limit`, `actual`. */
export declare class PayloadTooLarge extends Rejection {
  static readonly code: "PAYLOAD_TOO_LARGE";
  readonly code: "PAYLOAD_TOO_LARGE";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The payload encoding is not allowed. Has `encoding`, `allowed`. */
export declare class EncodingNotAllowed extends Rejection {
  static readonly code: "ENCODING_NOT_ALLOWED";
  readonly code: "ENCODING_NOT_ALLOWED";
  /** The encoding sent. */
  readonly encoding: string;
  /** Allowed encodings (empty: no payloads at all). */
  readonly allowed: string[];
}

/** The job type is not allowed on the queue. Has `jobType`, `allowed`. */
export declare class JobTypeNotAllowed extends Rejection {
  static readonly code: "JOB_TYPE_NOT_ALLOWED";
  readonly code: "JOB_TYPE_NOT_ALLOWED";
  /** The job type sent. */
  readonly jobType: string;
  /** Allowed job types. */
  readonly allowed: string[];
}

/** Too many custom entries. Has `limit`, `actual`. */
export declare class CustomEntriesTooMany extends Rejection {
  static readonly code: "CUSTOM_ENTRIES_TOO_MANY";
  readonly code: "CUSTOM_ENTRIES_TOO_MANY";
  /** Entries allowed. */
  readonly limit: number;
  /** Entries sent. */
  readonly actual: number;
}

/** The custom map is too large. Has `limit`, `actual` (bytes). */
export declare class CustomMapTooLarge extends Rejection {
  static readonly code: "CUSTOM_MAP_TOO_LARGE";
  readonly code: "CUSTOM_MAP_TOO_LARGE";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes counted. */
  readonly actual: number;
}

/** A custom key is too long. Has `key`, `limit`, `actual` (bytes). */
export declare class CustomKeyTooLong extends Rejection {
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
export declare class QueueNameTooLong extends Rejection {
  static readonly code: "QUEUE_NAME_TOO_LONG";
  readonly code: "QUEUE_NAME_TOO_LONG";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The job type is too long. Has `limit`, `actual` (bytes). */
export declare class JobTypeNameTooLong extends Rejection {
  static readonly code: "JOB_TYPE_NAME_TOO_LONG";
  readonly code: "JOB_TYPE_NAME_TOO_LONG";
  /** Bytes allowed. */
  readonly limit: number;
  /** Bytes sent. */
  readonly actual: number;
}

/** The idempotency key is longer than `limit` UTF-8 bytes; checked before sending. Has `limit`, `actual`. */
export declare class IdempotencyKeyTooLong extends Rejection {
  static readonly code: "IDEMPOTENCY_KEY_TOO_LONG";
  readonly code: "IDEMPOTENCY_KEY_TOO_LONG";
  /** UTF-8 bytes allowed: the server's `maxIdempotencyKeyBytes` (256 until known). */
  readonly limit: number;
  /** UTF-8 bytes of the key. */
  readonly actual: number;
}

/** `scheduledAt` is beyond the schedule horizon. Has `horizonMs`, `scheduledAt`. */
export declare class ScheduledTooFar extends Rejection {
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
export declare class InvalidRequest extends Rejection {
  static readonly code: "INVALID_REQUEST";
  readonly code: "INVALID_REQUEST";
}

/** The queue is full. Transient: `retryable` is true. Has `queue`, `limit`. */
export declare class QueueFull extends Rejection {
  static readonly code: "QUEUE_FULL";
  readonly code: "QUEUE_FULL";
  /** The queue. */
  readonly queue: string;
  /** Its `max_queue_depth`. */
  readonly limit: number;
}

/** The queue is being deleted. Transient. Has `queue`. */
export declare class QueueClosing extends Rejection {
  static readonly code: "QUEUE_CLOSING";
  readonly code: "QUEUE_CLOSING";
  /** The queue. */
  readonly queue: string;
}

/** A rejection this client does not know (a newer server). */
export declare class UnknownRejection extends Rejection {
  static readonly code: "UNKNOWN_REJECTION";
  readonly code: "UNKNOWN_REJECTION";
}

/** Every subclass, by its code. */
export declare const errorClasses: {
  readonly TRANSPORT: typeof Transport;
  readonly UNAUTHENTICATED: typeof Unauthenticated;
  readonly OVERLOADED: typeof Overloaded;
  readonly INVALID_ARGUMENT: typeof InvalidArgument;
  readonly FAILED_PRECONDITION: typeof FailedPrecondition;
  readonly JOB_NOT_IN_FLIGHT: typeof JobNotInFlight;
  readonly ATTEMPT_MISMATCH: typeof AttemptMismatch;
  readonly SERVER_FAULT: typeof ServerFault;
  readonly UNSUPPORTED: typeof Unsupported;
  readonly INVALID_CONFIG: typeof InvalidConfig;
  readonly UNKNOWN_QUEUE: typeof UnknownQueue;
  readonly PAYLOAD_TOO_LARGE: typeof PayloadTooLarge;
  readonly ENCODING_NOT_ALLOWED: typeof EncodingNotAllowed;
  readonly JOB_TYPE_NOT_ALLOWED: typeof JobTypeNotAllowed;
  readonly CUSTOM_ENTRIES_TOO_MANY: typeof CustomEntriesTooMany;
  readonly CUSTOM_MAP_TOO_LARGE: typeof CustomMapTooLarge;
  readonly CUSTOM_KEY_TOO_LONG: typeof CustomKeyTooLong;
  readonly QUEUE_NAME_TOO_LONG: typeof QueueNameTooLong;
  readonly JOB_TYPE_NAME_TOO_LONG: typeof JobTypeNameTooLong;
  readonly IDEMPOTENCY_KEY_TOO_LONG: typeof IdempotencyKeyTooLong;
  readonly SCHEDULED_TOO_FAR: typeof ScheduledTooFar;
  readonly INVALID_REQUEST: typeof InvalidRequest;
  readonly QUEUE_FULL: typeof QueueFull;
  readonly QUEUE_CLOSING: typeof QueueClosing;
  readonly UNKNOWN_REJECTION: typeof UnknownRejection;
};
