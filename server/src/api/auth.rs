//! API keys and their roles: `authorization: Bearer <key>` on every call but the health
//! service's when `[auth] api_keys` or `auth.api_keys_file` is set. Missing, unknown or without
//! the `Bearer ` prefix → `UNAUTHENTICATED`; a known key without the role the call needs →
//! `PERMISSION_DENIED` naming the role. Checked on a call's headers, before any of its request
//! body is read (`api::admission`).
//!
//! Keys are compared in constant time, length included: each configured key is kept as its
//! SHA-256 digest, the presented key is hashed once, and its digest is compared with every
//! configured digest with `subtle` (the time depends only on the number of keys and the
//! presented key's own length, which the caller knows anyway).
//!
//! `auth.api_keys_file` is read at start and on [`ApiKeyAuth::reload`] (SIGHUP): a key the new
//! file no longer holds stays valid, with the roles it had, for `auth.rotation_overlap_ms`. A
//! file that does not load leaves the keys in force unchanged.

use crate::config::{ApiKey, ApiKeysFile, AuthConfig, ConfigError, Role, check_api_keys};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tonic::Status;

/// One accepted key.
#[derive(Clone)]
struct Entry {
    name: String,
    digest: [u8; 32],
    roles: Vec<Role>,
}

impl Entry {
    fn new(k: &ApiKey) -> Self {
        Entry {
            name: k.name.clone(),
            digest: digest(k.key.as_bytes()),
            roles: k.roles.clone(),
        }
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The keys of `api_keys_file`: those of its last good load, and those a reload removed with
/// the instant they stop being accepted.
#[derive(Default)]
struct FileKeys {
    current: Vec<Entry>,
    retired: Vec<(Entry, Instant)>,
}

struct Keys {
    inline: Vec<Entry>,
    /// The raw inline keys, to check a reloaded file against (unique secrets across both).
    inline_raw: Vec<ApiKey>,
    file: Option<PathBuf>,
    overlap: Duration,
    from_file: RwLock<FileKeys>,
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    /// Keys the file now holds.
    pub keys: usize,
    /// Keys removed by this or an earlier reload and still accepted (overlap not over).
    pub retired: usize,
}

/// The configured API keys.
#[derive(Clone)]
pub struct ApiKeyAuth {
    /// `None`: auth is off.
    keys: Option<Arc<Keys>>,
}

impl ApiKeyAuth {
    /// Auth from `[auth]`, reading `api_keys_file` when it is set.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or holds an invalid key.
    pub(crate) fn from_config(auth: &AuthConfig) -> Result<Self, ConfigError> {
        if auth.api_keys.is_none() && auth.api_keys_file.is_none() {
            return Ok(ApiKeyAuth { keys: None });
        }
        let inline_raw = auth.api_keys.clone().unwrap_or_default();
        let keys = Keys {
            inline: inline_raw.iter().map(Entry::new).collect(),
            inline_raw,
            file: auth.api_keys_file.clone(),
            overlap: Duration::from_millis(auth.rotation_overlap_ms),
            from_file: RwLock::new(FileKeys::default()),
        };
        let me = ApiKeyAuth {
            keys: Some(Arc::new(keys)),
        };
        me.reload()?;
        Ok(me)
    }

    /// Reads `auth.api_keys_file` again (nothing to do without one). Keys it no longer holds
    /// stay accepted for `auth.rotation_overlap_ms`; the roles of the keys it holds are
    /// replaced.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or holds an invalid key; the keys in
    /// force are then unchanged.
    pub fn reload(&self) -> Result<Reloaded, ConfigError> {
        let Some(keys) = &self.keys else {
            return Ok(Reloaded {
                keys: 0,
                retired: 0,
            });
        };
        let Some(path) = &keys.file else {
            return Ok(Reloaded {
                keys: 0,
                retired: 0,
            });
        };
        let file = ApiKeysFile::read(path)?;
        let in_file =
            |e: ConfigError| ConfigError(format!("auth.api_keys_file {}: {}", path.display(), e.0));
        check_api_keys("api_keys", &file.api_keys).map_err(in_file)?;
        check_api_keys(
            "auth.api_keys followed by api_keys",
            keys.inline_raw.iter().chain(&file.api_keys),
        )
        .map_err(in_file)?;
        let new: Vec<Entry> = file.api_keys.iter().map(Entry::new).collect();
        let now = Instant::now();
        let until = now + keys.overlap;
        let mut state = keys
            .from_file
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = |e: &Entry| new.iter().any(|n| n.digest == e.digest);
        let old = std::mem::take(&mut state.current);
        state.retired.retain(|(e, until)| *until > now && !held(e));
        for e in old {
            if !held(&e) && !keys.overlap.is_zero() {
                state.retired.push((e, until));
            }
        }
        state.current = new;
        Ok(Reloaded {
            keys: state.current.len(),
            retired: state.retired.len(),
        })
    }

    /// Checks the `authorization` header of a call, and that its key has `needed` (any known
    /// key will do when `None`). `call` names the call in a refusal.
    pub(crate) fn check(
        &self,
        headers: &http::HeaderMap,
        needed: Option<Role>,
        call: &str,
    ) -> Result<(), Status> {
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
        let Some(e) = matched(keys, key) else {
            return Err(Status::unauthenticated("unknown api key"));
        };
        if let Some(role) = needed
            && !e.roles.contains(&role)
        {
            return Err(Status::permission_denied(format!(
                "api key {:?} lacks the role \"{}\", which {call} needs (auth.api_keys[].roles)",
                e.name,
                role.as_str()
            )));
        }
        tracing::trace!(api_key = e.name.as_str(), "authenticated");
        Ok(())
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
        matched(keys, key).map(|e| e.name)
    }
}

/// An accepted API key as the admin UI sees it: its name, the SHA-256 digest of its secret
/// (never the secret) and its roles at the time of the lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyIdentity {
    /// The key's `name`.
    pub name: String,
    /// SHA-256 of the key's secret.
    pub digest: [u8; 32],
    /// Its roles now (a reload of `api_keys_file` may have changed them).
    pub roles: Vec<Role>,
}

impl From<Entry> for KeyIdentity {
    fn from(e: Entry) -> Self {
        KeyIdentity {
            name: e.name,
            digest: e.digest,
            roles: e.roles,
        }
    }
}

impl ApiKeyAuth {
    /// Whether API keys are checked at all (`[auth] api_keys` or `api_keys_file` set).
    pub fn is_on(&self) -> bool {
        self.keys.is_some()
    }

    /// The accepted key whose secret is `key`, by the same rule as a gRPC call's `authorization`
    /// header (inline keys, the key file's, and keys a reload retired less than
    /// `auth.rotation_overlap_ms` ago). `None` when auth is off or no key matches.
    pub fn identify(&self, key: &str) -> Option<KeyIdentity> {
        matched(self.keys.as_ref()?, key).map(KeyIdentity::from)
    }

    /// Every key accepted now, as [`Self::identify`] would accept it. Empty when auth is off.
    pub fn accepted(&self) -> Vec<KeyIdentity> {
        let Some(keys) = &self.keys else {
            return Vec::new();
        };
        let now = Instant::now();
        let state = keys
            .from_file
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let live_retired = state
            .retired
            .iter()
            .filter(|(_, until)| *until > now)
            .map(|(e, _)| e);
        keys.inline
            .iter()
            .chain(&state.current)
            .chain(live_retired)
            .cloned()
            .map(KeyIdentity::from)
            .collect()
    }
}

/// The accepted key equal to `key` (configured inline, in the key file, or retired by a reload
/// less than `auth.rotation_overlap_ms` ago). Compares every accepted key's digest in constant
/// time, whatever matched earlier, so timing reveals neither a matching prefix nor which key.
fn matched(keys: &Keys, key: &str) -> Option<Entry> {
    let presented = digest(key.as_bytes());
    let now = Instant::now();
    let state = keys
        .from_file
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut matched: Option<&Entry> = None;
    let live_retired = state
        .retired
        .iter()
        .filter(|(_, until)| *until > now)
        .map(|(e, _)| e);
    for e in keys.inline.iter().chain(&state.current).chain(live_retired) {
        if bool::from(e.digest.ct_eq(&presented)) {
            matched = Some(e);
        }
    }
    matched.cloned()
}

/// Installs the SIGHUP handler now, and returns the task that reloads `auth`'s key file on
/// every SIGHUP until `stop`, logging the outcome.
///
/// The handler is installed before this returns, not when the task first runs: a SIGHUP that
/// arrives between the server saying it is ready and the task's first poll would otherwise meet
/// the default action and end the process.
pub(crate) fn reload_on_sighup(
    auth: ApiKeyAuth,
    stop: tokio_util::sync::CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let hup = {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the SIGHUP handler: keys reload only at restart");
                None
            }
        }
    };
    async move {
        #[cfg(unix)]
        {
            let Some(mut hup) = hup else { return };
            loop {
                tokio::select! {
                    got = hup.recv() => if got.is_none() { return },
                    () = stop.cancelled() => return,
                }
                match auth.reload() {
                    Ok(r) if auth.keys.as_ref().is_some_and(|k| k.file.is_some()) => {
                        tracing::info!(
                            keys = r.keys,
                            retired = r.retired,
                            "SIGHUP: api keys reloaded"
                        );
                    }
                    Ok(_) => tracing::info!("SIGHUP: no auth.api_keys_file to reload"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: api keys not reloaded; the keys in force stay");
                    }
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = (auth, stop);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(key: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("authorization", format!("Bearer {key}").parse().unwrap());
        h
    }

    #[test]
    fn a_key_that_is_a_prefix_or_extension_of_a_real_one_is_refused() {
        let auth = ApiKeyAuth::from_config(&AuthConfig {
            api_keys: Some(vec![ApiKey::new("a", "secret")]),
            ..AuthConfig::default()
        })
        .unwrap();
        auth.check(&headers("secret"), None, "X").unwrap();
        for bad in ["secre", "secret2", "", "Secret"] {
            let e = auth.check(&headers(bad), None, "X").unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn a_reload_that_fails_keeps_the_keys_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, "[[api_keys]]\nname = \"a\"\nkey = \"one\"\n").unwrap();
        let auth = ApiKeyAuth::from_config(&AuthConfig {
            api_keys_file: Some(path.clone()),
            rotation_overlap_ms: 0,
            ..AuthConfig::default()
        })
        .unwrap();
        auth.check(&headers("one"), Some(Role::Admin), "X").unwrap();
        for bad in [
            "not toml [",
            "[[api_keys]]\nname = \"a\"\nkey = \"\"\n",
            "[[api_keys]]\nname = \"a\"\nkey = \"two\"\nroles = [\"root\"]\n",
            "[[api_keys]]\nname = \"a\"\nkey = \"two\"\n[[api_keys]]\nname = \"b\"\nkey = \"two\"\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = auth.reload().unwrap_err();
            assert!(e.to_string().contains("keys.toml"), "{e}");
            auth.check(&headers("one"), Some(Role::Admin), "X").unwrap();
            let e = auth.check(&headers("two"), None, "X").unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        std::fs::remove_file(&path).unwrap();
        auth.reload().unwrap_err();
        auth.check(&headers("one"), None, "X").unwrap();
    }

    #[test]
    fn a_file_key_may_not_repeat_an_inline_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, "[[api_keys]]\nname = \"b\"\nkey = \"one\"\n").unwrap();
        let e = ApiKeyAuth::from_config(&AuthConfig {
            api_keys: Some(vec![ApiKey::new("a", "one")]),
            api_keys_file: Some(path),
            ..AuthConfig::default()
        })
        .err()
        .expect("a repeated key is refused");
        assert!(e.to_string().contains("repeats"), "{e}");
    }
}
