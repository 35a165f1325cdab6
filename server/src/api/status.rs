//! The only place where a domain error becomes a gRPC status (table in `docs/errors.md`).

use crate::error::{ErrorCode, QueueError};
use tonic::{Code, Status};

/// The gRPC code of each [`ErrorCode`].
pub(crate) fn grpc_code(code: ErrorCode) -> Code {
    match code {
        ErrorCode::InvalidArgument => Code::InvalidArgument,
        ErrorCode::FailedPrecondition => Code::FailedPrecondition,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::Internal => Code::Internal,
        ErrorCode::ResourceExhausted => Code::ResourceExhausted,
        ErrorCode::Unavailable => Code::Unavailable,
    }
}

impl From<QueueError> for Status {
    fn from(e: QueueError) -> Self {
        let code = grpc_code(e.code());
        if code == Code::Internal {
            tracing::error!(error = %e, "request failed in storage");
        }
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_status() {
        let mut seen: Vec<Code> = ErrorCode::ALL.iter().map(|c| grpc_code(*c)).collect();
        seen.dedup();
        assert_eq!(seen.len(), ErrorCode::ALL.len());
    }
}
