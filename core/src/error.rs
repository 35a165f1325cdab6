//! Errors of the client, one enum per operation over a shared [`ClientError`], each with a
//! stable SCREAMING_SNAKE code ([`ErrorCode`]) that the Python and Node bindings map to their
//! own exception classes.

use std::fmt;
use std::time::Duration;

/// Every stable error code of the client. Bindings map each to a class; a test checks that
/// none is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The server could not be reached, or the call was cut off (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, ABORTED, CANCELLED). Retryable.
    Transport,
    /// Missing or wrong API key (UNAUTHENTICATED). Not retryable.
    Unauthenticated,
    /// The API key lacks the role the call needs (PERMISSION_DENIED); the message names the
    /// role. Not retryable.
    PermissionDenied,
    /// The server sheds load (RESOURCE_EXHAUSTED). Retryable after a pause.
    Overloaded,
    /// The server refused the request as malformed (INVALID_ARGUMENT, OUT_OF_RANGE).
    InvalidArgument,
    /// Strict mode and an undeclared queue was listed (FAILED_PRECONDITION on Reserve).
    FailedPrecondition,
    /// The job is not in flight any more: acked, lease expired, dead-lettered or never existed
    /// (NOT_FOUND on Ack / Nack / Extend). Treat as "lease lost".
    JobNotInFlight,
    /// The job is in flight under another attempt (FAILED_PRECONDITION on Ack / Nack /
    /// Extend): this delivery's lease was lost and the job redelivered.
    AttemptMismatch,
    /// The server failed (INTERNAL, DATA_LOSS, UNKNOWN, or an answer this client cannot read).
    ServerFault,
    /// The server does not implement the call (UNIMPLEMENTED).
    Unsupported,
    /// The address or TLS settings given to the client are unusable.
    InvalidConfig,
    /// A job was rejected; the rejection's own code says why.
    UnknownQueue,
    /// Rejection: payload larger than the limit.
    PayloadTooLarge,
    /// Rejection: encoding not allowed.
    EncodingNotAllowed,
    /// Rejection: job type not allowed on the queue.
    JobTypeNotAllowed,
    /// Rejection: too many custom entries.
    CustomEntriesTooMany,
    /// Rejection: custom map too large.
    CustomMapTooLarge,
    /// Rejection: a custom key too long.
    CustomKeyTooLong,
    /// Rejection: queue name too long.
    QueueNameTooLong,
    /// Rejection: job type too long.
    JobTypeNameTooLong,
    /// Rejection: idempotency key too long.
    IdempotencyKeyTooLong,
    /// Rejection: scheduled beyond the horizon.
    ScheduledTooFar,
    /// Rejection: structurally invalid (empty name, priority over 9, empty key, ...).
    InvalidRequest,
    /// Rejection: the queue is full (transient).
    QueueFull,
    /// Rejection: the queue is being deleted (transient).
    QueueClosing,
    /// Rejection: the idempotency key names a job with other contents (queues with
    /// `key_conflict = "reject"`).
    IdempotencyKeyConflict,
    /// Rejection: the job would create a queue past the server's `limits.max_queues`.
    TooManyQueues,
    /// Rejection of a kind this client does not know.
    UnknownRejection,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::Transport,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::Overloaded,
        ErrorCode::InvalidArgument,
        ErrorCode::FailedPrecondition,
        ErrorCode::JobNotInFlight,
        ErrorCode::AttemptMismatch,
        ErrorCode::ServerFault,
        ErrorCode::Unsupported,
        ErrorCode::InvalidConfig,
        ErrorCode::UnknownQueue,
        ErrorCode::PayloadTooLarge,
        ErrorCode::EncodingNotAllowed,
        ErrorCode::JobTypeNotAllowed,
        ErrorCode::CustomEntriesTooMany,
        ErrorCode::CustomMapTooLarge,
        ErrorCode::CustomKeyTooLong,
        ErrorCode::QueueNameTooLong,
        ErrorCode::JobTypeNameTooLong,
        ErrorCode::IdempotencyKeyTooLong,
        ErrorCode::ScheduledTooFar,
        ErrorCode::InvalidRequest,
        ErrorCode::QueueFull,
        ErrorCode::QueueClosing,
        ErrorCode::IdempotencyKeyConflict,
        ErrorCode::TooManyQueues,
        ErrorCode::UnknownRejection,
    ];

    /// The stable SCREAMING_SNAKE name, e.g. `IDEMPOTENCY_KEY_TOO_LONG`.
    pub fn as_str(self) -> &'static str {
        self.names().0
    }

    /// The name of the exception class for this code in Python (`sepp.errors`) and of the
    /// `Error` subclass in TypeScript (`errors.js`): the code in PascalCase followed by
    /// `Error`, e.g. `IdempotencyKeyTooLongError`. Each binding's tests check its classes
    /// against this, and `docs/errors.md` lists it.
    pub fn class_name(self) -> &'static str {
        self.names().1
    }

    /// The one table of the code's names: (code, class name).
    fn names(self) -> (&'static str, &'static str) {
        match self {
            ErrorCode::Transport => ("TRANSPORT", "TransportError"),
            ErrorCode::Unauthenticated => ("UNAUTHENTICATED", "UnauthenticatedError"),
            ErrorCode::PermissionDenied => ("PERMISSION_DENIED", "PermissionDeniedError"),
            ErrorCode::Overloaded => ("OVERLOADED", "OverloadedError"),
            ErrorCode::InvalidArgument => ("INVALID_ARGUMENT", "InvalidArgumentError"),
            ErrorCode::FailedPrecondition => ("FAILED_PRECONDITION", "FailedPreconditionError"),
            ErrorCode::JobNotInFlight => ("JOB_NOT_IN_FLIGHT", "JobNotInFlightError"),
            ErrorCode::AttemptMismatch => ("ATTEMPT_MISMATCH", "AttemptMismatchError"),
            ErrorCode::ServerFault => ("SERVER_FAULT", "ServerFaultError"),
            ErrorCode::Unsupported => ("UNSUPPORTED", "UnsupportedError"),
            ErrorCode::InvalidConfig => ("INVALID_CONFIG", "InvalidConfigError"),
            ErrorCode::UnknownQueue => ("UNKNOWN_QUEUE", "UnknownQueueError"),
            ErrorCode::PayloadTooLarge => ("PAYLOAD_TOO_LARGE", "PayloadTooLargeError"),
            ErrorCode::EncodingNotAllowed => ("ENCODING_NOT_ALLOWED", "EncodingNotAllowedError"),
            ErrorCode::JobTypeNotAllowed => ("JOB_TYPE_NOT_ALLOWED", "JobTypeNotAllowedError"),
            ErrorCode::CustomEntriesTooMany => {
                ("CUSTOM_ENTRIES_TOO_MANY", "CustomEntriesTooManyError")
            }
            ErrorCode::CustomMapTooLarge => ("CUSTOM_MAP_TOO_LARGE", "CustomMapTooLargeError"),
            ErrorCode::CustomKeyTooLong => ("CUSTOM_KEY_TOO_LONG", "CustomKeyTooLongError"),
            ErrorCode::QueueNameTooLong => ("QUEUE_NAME_TOO_LONG", "QueueNameTooLongError"),
            ErrorCode::JobTypeNameTooLong => ("JOB_TYPE_NAME_TOO_LONG", "JobTypeNameTooLongError"),
            ErrorCode::IdempotencyKeyTooLong => {
                ("IDEMPOTENCY_KEY_TOO_LONG", "IdempotencyKeyTooLongError")
            }
            ErrorCode::ScheduledTooFar => ("SCHEDULED_TOO_FAR", "ScheduledTooFarError"),
            ErrorCode::InvalidRequest => ("INVALID_REQUEST", "InvalidRequestError"),
            ErrorCode::QueueFull => ("QUEUE_FULL", "QueueFullError"),
            ErrorCode::QueueClosing => ("QUEUE_CLOSING", "QueueClosingError"),
            ErrorCode::IdempotencyKeyConflict => {
                ("IDEMPOTENCY_KEY_CONFLICT", "IdempotencyKeyConflictError")
            }
            ErrorCode::TooManyQueues => ("TOO_MANY_QUEUES", "TooManyQueuesError"),
            ErrorCode::UnknownRejection => ("UNKNOWN_REJECTION", "UnknownRejectionError"),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one job was not accepted: the same value whether the client found the problem before
/// sending or the server reported it. Sizes are UTF-8 bytes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// Strict mode and the queue is not declared. Deterministic.
    #[error("queue {queue:?} is not declared and the server is in strict mode")]
    UnknownQueue {
        /// The queue named.
        queue: String,
    },
    /// The payload exceeds `max_payload_bytes`. Deterministic.
    #[error(
        "payload is {actual} bytes, over the limit of {limit} bytes (the server's \
         limits.max_payload_bytes, or the queue's own max_payload_bytes)"
    )]
    PayloadTooLarge {
        /// Bytes allowed.
        limit: u64,
        /// Bytes sent.
        actual: u64,
    },
    /// The encoding is not allowed. Deterministic.
    #[error("payload encoding {encoding:?} is not allowed (allowed: {allowed:?})")]
    EncodingNotAllowed {
        /// The encoding sent.
        encoding: String,
        /// Allowed encodings (empty: no payloads at all).
        allowed: Vec<String>,
    },
    /// The job type is not allowed on the queue. Deterministic.
    #[error("job_type {job_type:?} is not allowed (allowed: {allowed:?})")]
    JobTypeNotAllowed {
        /// The job type sent.
        job_type: String,
        /// Allowed job types.
        allowed: Vec<String>,
    },
    /// Too many custom entries. Deterministic.
    #[error("custom has {actual} entries, max_custom_entries is {limit}")]
    CustomEntriesTooMany {
        /// Entries allowed.
        limit: u32,
        /// Entries sent.
        actual: u32,
    },
    /// The custom map is too large. Deterministic.
    #[error("custom is {actual} bytes, max_custom_total_bytes is {limit}")]
    CustomMapTooLarge {
        /// Bytes allowed.
        limit: u64,
        /// Bytes counted.
        actual: u64,
    },
    /// A custom key is too long. Deterministic.
    #[error("custom key {key:?} is {actual} bytes, max_custom_key_bytes is {limit}")]
    CustomKeyTooLong {
        /// The key.
        key: String,
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The queue name is too long. Deterministic.
    #[error("queue is {actual} bytes, max_queue_name_bytes is {limit}")]
    QueueNameTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The job type is too long. Deterministic.
    #[error("job_type is {actual} bytes, max_job_type_bytes is {limit}")]
    JobTypeNameTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// The idempotency key is too long. Deterministic; checked by the client before sending,
    /// against the server's advertised limit (256 until known).
    #[error("idempotency_key is {actual} bytes, max_idempotency_key_bytes is {limit}")]
    IdempotencyKeyTooLong {
        /// Bytes allowed.
        limit: u32,
        /// Bytes sent.
        actual: u64,
    },
    /// Scheduled beyond the horizon. Deterministic.
    #[error("scheduled_at is beyond the schedule horizon of {horizon:?}")]
    ScheduledTooFar {
        /// The horizon.
        horizon: Duration,
        /// The requested time.
        actual: std::time::SystemTime,
    },
    /// Structurally invalid; the message names the field. Deterministic.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
    },
    /// The queue is full. Transient: retry later.
    #[error("queue {queue:?} is full (max_queue_depth {limit})")]
    QueueFull {
        /// The queue.
        queue: String,
        /// Its depth limit.
        limit: u64,
    },
    /// The queue is being deleted. Transient.
    #[error("queue {queue:?} is closing")]
    QueueClosing {
        /// The queue.
        queue: String,
    },
    /// The idempotency key's live record names `original_job_id`, enqueued with a different
    /// job type, payload, encoding, priority or custom map (queues with
    /// `key_conflict = "reject"`). Deterministic: never retried.
    #[error(
        "idempotency_key already names job {original_job_id}, enqueued with other contents \
         (key_conflict = \"reject\")"
    )]
    IdempotencyKeyConflict {
        /// The job the key names.
        original_job_id: String,
    },
    /// The queue does not exist yet and the server holds `limits.max_queues` queues already.
    /// Not retried: it lasts until an operator deletes queues or raises the cap.
    #[error("queue {queue:?} would be a new queue past limits.max_queues ({limit})")]
    TooManyQueues {
        /// The queue the job would have created.
        queue: String,
        /// `limits.max_queues`.
        limit: u64,
    },
    /// A rejection this client does not know (newer server).
    #[error("job rejected for a reason this client does not know")]
    Unknown,
}

impl Rejection {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::UnknownQueue { .. } => ErrorCode::UnknownQueue,
            Rejection::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Rejection::EncodingNotAllowed { .. } => ErrorCode::EncodingNotAllowed,
            Rejection::JobTypeNotAllowed { .. } => ErrorCode::JobTypeNotAllowed,
            Rejection::CustomEntriesTooMany { .. } => ErrorCode::CustomEntriesTooMany,
            Rejection::CustomMapTooLarge { .. } => ErrorCode::CustomMapTooLarge,
            Rejection::CustomKeyTooLong { .. } => ErrorCode::CustomKeyTooLong,
            Rejection::QueueNameTooLong { .. } => ErrorCode::QueueNameTooLong,
            Rejection::JobTypeNameTooLong { .. } => ErrorCode::JobTypeNameTooLong,
            Rejection::IdempotencyKeyTooLong { .. } => ErrorCode::IdempotencyKeyTooLong,
            Rejection::ScheduledTooFar { .. } => ErrorCode::ScheduledTooFar,
            Rejection::InvalidRequest { .. } => ErrorCode::InvalidRequest,
            Rejection::QueueFull { .. } => ErrorCode::QueueFull,
            Rejection::QueueClosing { .. } => ErrorCode::QueueClosing,
            Rejection::IdempotencyKeyConflict { .. } => ErrorCode::IdempotencyKeyConflict,
            Rejection::TooManyQueues { .. } => ErrorCode::TooManyQueues,
            Rejection::Unknown => ErrorCode::UnknownRejection,
        }
    }

    /// True for `QueueFull` and `QueueClosing`: the same job may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Rejection::QueueFull { .. } | Rejection::QueueClosing { .. }
        )
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Rejection::InvalidRequest {
            message: message.into(),
        }
    }

    /// The rejection's fields, flattened: each kind sets its own and leaves the others `None`.
    ///
    /// Bindings copy these instead of matching the variants themselves: the match is written
    /// once, here, without a wildcard arm, so a new kind of rejection cannot be added without
    /// saying which fields it carries, and a new field cannot be added without every binding
    /// (which destructures [`RejectionFields`] whole) handing it on.
    pub fn fields(&self) -> RejectionFields {
        let none = RejectionFields::default();
        match self {
            Rejection::UnknownQueue { queue } | Rejection::QueueClosing { queue } => {
                RejectionFields {
                    queue: Some(queue.clone()),
                    ..none
                }
            }
            Rejection::QueueFull { queue, limit } | Rejection::TooManyQueues { queue, limit } => {
                RejectionFields {
                    queue: Some(queue.clone()),
                    limit: Some(*limit),
                    ..none
                }
            }
            Rejection::PayloadTooLarge { limit, actual }
            | Rejection::CustomMapTooLarge { limit, actual } => RejectionFields {
                limit: Some(*limit),
                actual: Some(*actual),
                ..none
            },
            Rejection::CustomEntriesTooMany { limit, actual } => RejectionFields {
                limit: Some(u64::from(*limit)),
                actual: Some(u64::from(*actual)),
                ..none
            },
            Rejection::QueueNameTooLong { limit, actual }
            | Rejection::JobTypeNameTooLong { limit, actual }
            | Rejection::IdempotencyKeyTooLong { limit, actual } => RejectionFields {
                limit: Some(u64::from(*limit)),
                actual: Some(*actual),
                ..none
            },
            Rejection::CustomKeyTooLong { key, limit, actual } => RejectionFields {
                key: Some(key.clone()),
                limit: Some(u64::from(*limit)),
                actual: Some(*actual),
                ..none
            },
            Rejection::EncodingNotAllowed { encoding, allowed } => RejectionFields {
                encoding: Some(encoding.clone()),
                allowed: Some(allowed.clone()),
                ..none
            },
            Rejection::JobTypeNotAllowed { job_type, allowed } => RejectionFields {
                job_type: Some(job_type.clone()),
                allowed: Some(allowed.clone()),
                ..none
            },
            Rejection::ScheduledTooFar { horizon, actual } => RejectionFields {
                horizon: Some(*horizon),
                scheduled_at: Some(*actual),
                ..none
            },
            Rejection::IdempotencyKeyConflict { original_job_id } => RejectionFields {
                original_job_id: Some(original_job_id.clone()),
                ..none
            },
            // The code and the message say everything about these.
            Rejection::InvalidRequest { .. } | Rejection::Unknown => none,
        }
    }
}

/// The fields of a [`Rejection`] as one flat record ([`Rejection::fields`]), for the bindings:
/// Python's `Rejection` value and the properties of a JavaScript rejection error. Only the
/// fields of the rejection's kind are set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RejectionFields {
    /// The queue named by `UNKNOWN_QUEUE`, `QUEUE_FULL`, `QUEUE_CLOSING` and
    /// `TOO_MANY_QUEUES`.
    pub queue: Option<String>,
    /// The limit of the size and count rejections (bytes or entries), the depth limit of
    /// `QUEUE_FULL`, and `limits.max_queues` for `TOO_MANY_QUEUES`.
    pub limit: Option<u64>,
    /// The size or count sent, for the size and count rejections.
    pub actual: Option<u64>,
    /// The encoding sent, for `ENCODING_NOT_ALLOWED`.
    pub encoding: Option<String>,
    /// The allowed encodings or job types.
    pub allowed: Option<Vec<String>>,
    /// The job type sent, for `JOB_TYPE_NOT_ALLOWED`.
    pub job_type: Option<String>,
    /// The custom key, for `CUSTOM_KEY_TOO_LONG`.
    pub key: Option<String>,
    /// The schedule horizon, for `SCHEDULED_TOO_FAR`.
    pub horizon: Option<Duration>,
    /// The requested time, for `SCHEDULED_TOO_FAR`.
    pub scheduled_at: Option<std::time::SystemTime>,
    /// The job the key names, for `IDEMPOTENCY_KEY_CONFLICT`.
    pub original_job_id: Option<String>,
}

/// A failure not about one job: the transport, auth, or the server.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ClientError {
    code: ErrorCode,
    message: String,
    grpc_code: Option<i32>,
}

impl ClientError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ClientError {
            code,
            message: message.into(),
            grpc_code: None,
        }
    }

    /// Classifies a gRPC status per the protocol's client conventions. `settle` selects the
    /// Ack / Nack / Extend meanings of NOT_FOUND and FAILED_PRECONDITION.
    ///
    /// The status's origin comes first: a status that tonic made from a failure of the
    /// connection (see [`is_connection_failure`]) is [`ErrorCode::Transport`] whatever its code
    /// (tonic gives such failures UNKNOWN or INTERNAL), and its message carries the cause. Only
    /// a status the server sent is classified by its code, so an UNKNOWN the server sent stays
    /// a server fault.
    pub(crate) fn from_status(s: &tonic::Status, settle: bool) -> Self {
        use tonic::Code as C;
        if is_connection_failure(s) {
            let message = match std::error::Error::source(s) {
                Some(cause) => {
                    let chain = crate::client::error_chain(cause);
                    if chain.starts_with(s.message()) {
                        chain
                    } else {
                        format!("{}: {chain}", s.message())
                    }
                }
                None => s.message().to_string(),
            };
            return ClientError {
                code: ErrorCode::Transport,
                message,
                grpc_code: Some(s.code() as i32),
            };
        }
        let code = match s.code() {
            C::Unavailable | C::DeadlineExceeded | C::Aborted | C::Cancelled => {
                ErrorCode::Transport
            }
            C::Unauthenticated => ErrorCode::Unauthenticated,
            C::PermissionDenied => ErrorCode::PermissionDenied,
            C::ResourceExhausted => ErrorCode::Overloaded,
            C::InvalidArgument | C::OutOfRange => ErrorCode::InvalidArgument,
            C::NotFound if settle => ErrorCode::JobNotInFlight,
            C::FailedPrecondition if settle => ErrorCode::AttemptMismatch,
            C::FailedPrecondition => ErrorCode::FailedPrecondition,
            C::Unimplemented => ErrorCode::Unsupported,
            _ => ErrorCode::ServerFault,
        };
        ClientError {
            code,
            message: s.message().to_string(),
            grpc_code: Some(s.code() as i32),
        }
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The server's (or transport's) message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The gRPC status code, when the error came from a status.
    pub fn grpc_code(&self) -> Option<i32> {
        self.grpc_code
    }

    /// Whether a later identical call may succeed (transport and overload errors).
    pub fn is_retryable(&self) -> bool {
        matches!(self.code, ErrorCode::Transport | ErrorCode::Overloaded)
    }
}

/// The message tonic gives a response that ended without a gRPC status (the stream was cut
/// off: hyper turns a RST_STREAM with NO_ERROR or CANCEL into a clean end of stream).
const MISSING_STATUS: &str = "protocol error: missing grpc-status trailer";

/// True when `status` was made by the client's transport from a failure of the connection or
/// the stream, not sent by the server: a reset, GOAWAY, broken pipe, refused connection, an
/// h2 protocol error, or a response cut off before its status. Such a status carries the
/// failure in its `source()` chain (tonic's `Status::from_error`); a status the server sent in
/// its trailers or headers has no source.
pub(crate) fn is_connection_failure(status: &tonic::Status) -> bool {
    use tonic::Code as C;
    // Codes that name the caller's own fault or overload keep their meaning.
    if !matches!(
        status.code(),
        C::Unknown | C::Internal | C::Unavailable | C::Cancelled | C::Aborted
    ) {
        return false;
    }
    let mut src = std::error::Error::source(status);
    if src.is_none() {
        return status.code() == C::Unknown && status.message().starts_with(MISSING_STATUS);
    }
    while let Some(e) = src {
        if e.is::<h2::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
            || e.is::<tonic::transport::Error>()
            || e.is::<tonic::ConnectError>()
        {
            return true;
        }
        src = e.source();
    }
    false
}

/// Errors of `enqueue`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnqueueError {
    /// The job was rejected, by the client before sending or by the server. Retrying the same
    /// job helps only when [`Rejection::is_transient`].
    #[error("job rejected: {0}")]
    Rejected(#[from] Rejection),
    /// The call failed as a whole. A keyed enqueue is always safe to retry; an unkeyed one may
    /// have been committed if the error came after sending.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl EnqueueError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            EnqueueError::Rejected(r) => r.code(),
            EnqueueError::Client(c) => c.code(),
        }
    }
}

/// Errors of `enqueue_batch` and `enqueue_atomic` as a whole (per-job problems are values).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// The batch is empty or larger than the server's `max_enqueue_batch`, or a job failed
    /// the client-side checks of `enqueue_atomic`.
    #[error("invalid batch: {0}")]
    Invalid(String),
    /// The call failed as a whole.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl BatchError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            BatchError::Invalid(_) => ErrorCode::InvalidArgument,
            BatchError::Client(c) => c.code(),
        }
    }
}

/// Errors of Ack, Nack and Extend.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    /// The job is not in flight (acked, lease expired, dead-lettered, never existed). Not
    /// retryable: the lease is lost, and the job will be (or was) delivered again.
    #[error("job {job_id} is not in flight: {message}")]
    NotInFlight {
        /// The job.
        job_id: String,
        /// The server's message.
        message: String,
    },
    /// The job is in flight under another attempt: this delivery's lease was lost and the job
    /// was redelivered. Not retryable.
    #[error("job {job_id} is in flight under another attempt: {message}")]
    AttemptMismatch {
        /// The job.
        job_id: String,
        /// The server's message.
        message: String,
    },
    /// The request was refused before sending (e.g. a zero lease duration).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The call failed as a whole.
    #[error(transparent)]
    Client(ClientError),
}

impl LeaseError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            LeaseError::NotInFlight { .. } => ErrorCode::JobNotInFlight,
            LeaseError::AttemptMismatch { .. } => ErrorCode::AttemptMismatch,
            LeaseError::Invalid(_) => ErrorCode::InvalidArgument,
            LeaseError::Client(c) => c.code(),
        }
    }

    /// True when the lease is gone (not in flight, or another attempt): stop working on the
    /// job; it is someone else's now.
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self,
            LeaseError::NotInFlight { .. } | LeaseError::AttemptMismatch { .. }
        )
    }

    pub(crate) fn from_client(job_id: &str, e: ClientError) -> Self {
        match e.code() {
            ErrorCode::JobNotInFlight => LeaseError::NotInFlight {
                job_id: job_id.to_string(),
                message: e.message,
            },
            ErrorCode::AttemptMismatch => LeaseError::AttemptMismatch {
                job_id: job_id.to_string(),
                message: e.message,
            },
            _ => LeaseError::Client(e),
        }
    }
}

/// Errors of Reserve and DrainDeadLetters.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReserveError {
    /// The request was refused before sending (no queues, zero lease, ...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The call failed as a whole (FAILED_PRECONDITION here: strict mode and an undeclared
    /// queue was listed).
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl ReserveError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ReserveError::Invalid(_) => ErrorCode::InvalidArgument,
            ReserveError::Client(c) => c.code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_and_screaming_snake() {
        let names: HashSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        for n in names {
            assert!(n.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{n}");
        }
    }

    #[test]
    fn class_names_are_the_code_in_pascal_case_then_error() {
        for code in ErrorCode::ALL {
            let pascal: String = code
                .as_str()
                .split('_')
                .map(|w| w[..1].to_string() + &w[1..].to_ascii_lowercase())
                .collect();
            assert_eq!(code.class_name(), format!("{pascal}Error"));
        }
    }

    /// docs/errors.md has one row per code with its class, for every language.
    #[test]
    fn the_error_docs_list_every_code_with_its_class() {
        let docs = include_str!("../../docs/errors.md");
        for code in ErrorCode::ALL {
            let row = format!("| `{}` | `{}` |", code.as_str(), code.class_name());
            assert!(docs.contains(&row), "docs/errors.md lacks the row {row}");
        }
    }

    #[test]
    fn statuses_map_per_the_protocol_conventions() {
        let s = |c| tonic::Status::new(c, "m");
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::Unavailable), false).code(),
            ErrorCode::Transport
        );
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::OutOfRange), false).code(),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::NotFound), true).code(),
            ErrorCode::JobNotInFlight
        );
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::FailedPrecondition), true).code(),
            ErrorCode::AttemptMismatch
        );
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::FailedPrecondition), false).code(),
            ErrorCode::FailedPrecondition
        );
        assert_eq!(
            ClientError::from_status(&s(tonic::Code::DataLoss), false).code(),
            ErrorCode::ServerFault
        );
    }
}
