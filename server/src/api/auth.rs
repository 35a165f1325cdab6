//! API keys: `authorization: Bearer <key>` on every call but the health service's when
//! `[auth] api_keys` is set. Missing, unknown or without the `Bearer ` prefix →
//! `UNAUTHENTICATED`. Checked on a call's headers, before any of its request body is read
//! ([`super::admission`]).

use crate::config::ApiKey;
use std::sync::Arc;
use tonic::Status;

/// The configured API keys.
#[derive(Clone)]
pub(crate) struct ApiKeyAuth {
    /// `None`: auth is off. `Some(empty)`: everything is refused.
    keys: Option<Arc<Vec<ApiKey>>>,
}

impl ApiKeyAuth {
    pub(crate) fn new(keys: Option<Vec<ApiKey>>) -> Self {
        ApiKeyAuth {
            keys: keys.map(Arc::new),
        }
    }

    /// Checks the `authorization` header of a call.
    pub(crate) fn check(&self, headers: &http::HeaderMap) -> Result<(), Status> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let header = headers.get("authorization").ok_or_else(|| {
            Status::unauthenticated(
                "missing authorization header: send \"authorization: Bearer <api key>\"",
            )
        })?;
        let value = header
            .to_str()
            .map_err(|_| Status::unauthenticated("authorization header is not ASCII"))?;
        let Some(key) = value.strip_prefix("Bearer ") else {
            return Err(Status::unauthenticated(
                "authorization header must be \"Bearer <api key>\"",
            ));
        };
        match matched(keys, key) {
            Some(name) => {
                tracing::trace!(api_key = name, "authenticated");
                Ok(())
            }
            None => Err(Status::unauthenticated("unknown api key")),
        }
    }

    /// The name of the API key a call was admitted with (for the audit log of operator
    /// actions); `None` when auth is off or the header names no configured key.
    pub(crate) fn caller(&self, headers: &http::HeaderMap) -> Option<String> {
        let keys = self.keys.as_ref()?;
        let key = headers
            .get("authorization")?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?;
        matched(keys, key).map(str::to_string)
    }
}

/// The name of the configured key equal to `key`. Compares every configured key in full, so
/// timing does not reveal a matching prefix.
fn matched<'a>(keys: &'a [ApiKey], key: &str) -> Option<&'a str> {
    let mut matched = None;
    for k in keys {
        if constant_time_eq(k.key.as_bytes(), key.as_bytes()) {
            matched = Some(k.name.as_str());
        }
    }
    matched
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
