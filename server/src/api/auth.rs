//! API keys: `authorization: Bearer <key>` on every sepp RPC when `[auth] api_keys` is set.
//! Missing, unknown or without the `Bearer ` prefix → `UNAUTHENTICATED`.

use crate::config::ApiKey;
use std::sync::Arc;
use tonic::{Request, Status};

/// The interceptor applied to the sepp services (not to health checks).
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

    pub(crate) fn check<T>(&self, req: Request<T>) -> Result<Request<T>, Status> {
        let Some(keys) = &self.keys else {
            return Ok(req);
        };
        let header = req.metadata().get("authorization").ok_or_else(|| {
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
        // Compare every configured key in full, so timing does not reveal a matching prefix.
        let mut matched = None;
        for k in keys.iter() {
            if constant_time_eq(k.key.as_bytes(), key.as_bytes()) {
                matched = Some(k.name.as_str());
            }
        }
        match matched {
            Some(name) => {
                tracing::trace!(api_key = name, "authenticated");
                Ok(req)
            }
            None => Err(Status::unauthenticated("unknown api key")),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl tonic::service::Interceptor for ApiKeyAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(req)
    }
}
