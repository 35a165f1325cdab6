//! The admin UI's sessions: a cookie signed with HMAC-SHA256 under `[admin_ui]
//! session_secret`, so any server holding the same secret accepts it and no server keeps a
//! session table.
//!
//! The cookie is `v1.WHO.EXPIRES.NONCE.SIG`: `WHO` is the key's fingerprint (the first 16 bytes
//! of HMAC(secret, SHA-256 of the key), hex; never the key, and without the secret not even a
//! hash of it), or `-` when auth is off; `EXPIRES` the end of the session in Unix milliseconds;
//! `NONCE` 16 random hex digits, so two sessions of one key differ; `SIG` the HMAC of everything
//! before it. Every request checks the signature and the expiry, then looks the fingerprint up
//! among the keys accepted *now* (the same [`ApiKeyAuth`] the gRPC service uses, reloaded on
//! SIGHUP), and checks that the key still has the `admin` role: removing a key, or its role,
//! ends its sessions at their next request.
//!
//! The CSRF token of a session is HMAC(secret, "csrf" + the cookie's signed part): a page of
//! another origin can neither read the cookie nor compute the token.

use crate::api::auth::{ApiKeyAuth, KeyIdentity};
use crate::config::{Role, SessionSecret};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt::Write;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Issues and checks session cookies.
pub(super) struct Sessions {
    secret: Vec<u8>,
    ttl_ms: u64,
    auth: ApiKeyAuth,
}

/// A request's valid session.
pub(super) struct Session {
    /// The token every form of this session carries.
    pub(super) csrf: String,
}

/// Why a cookie does not open a session.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Not of the expected shape, or its signature does not match (tampered, or signed with
    /// another secret).
    Invalid,
    /// Past its expiry.
    Expired,
    /// Its key is no longer accepted (removed from the key file, retired past the overlap).
    KeyGone,
    /// Its key lost the `admin` role.
    NotAdmin(String),
}

impl Refusal {
    /// What to tell the user.
    pub(super) fn message(&self) -> String {
        match self {
            Refusal::Invalid => "not logged in: log in with an admin API key".into(),
            Refusal::Expired => "the session expired: log in again".into(),
            Refusal::KeyGone => {
                "the API key of this session is no longer accepted: log in with a current key"
                    .into()
            }
            Refusal::NotAdmin(name) => not_admin(name),
        }
    }
}

/// Why a login is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LoginRefusal {
    /// No accepted key has this secret.
    UnknownKey,
    /// The key is accepted but lacks the `admin` role.
    NotAdmin(String),
}

fn not_admin(name: &str) -> String {
    format!(
        "api key {name:?} lacks the role \"admin\", which the admin UI needs \
         (auth.api_keys[].roles): log in with an admin key"
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Constant-time equality of two strings (their lengths are not secret).
fn same(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl Sessions {
    /// Sessions signed with `secret` (a random one when unset), lasting `ttl_ms`, for the keys
    /// of `auth`.
    pub(super) fn new(secret: Option<&SessionSecret>, ttl_ms: u64, auth: ApiKeyAuth) -> Self {
        let secret = match secret {
            Some(s) => s.expose().to_vec(),
            None => {
                let mut b = vec![0u8; 32];
                if let Err(e) = getrandom::fill(&mut b) {
                    // No OS randomness: fall back on v4 UUIDs (also from a CSPRNG).
                    tracing::warn!(error = %e, "no OS randomness for the admin UI session secret");
                    b = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
                        .iter()
                        .flat_map(|u| *u.as_bytes())
                        .collect();
                }
                b
            }
        };
        Sessions {
            secret,
            ttl_ms,
            auth,
        }
    }

    /// Whether logins need an API key.
    pub(super) fn auth_on(&self) -> bool {
        self.auth.is_on()
    }

    /// How long a session lasts, in seconds (the cookie's `Max-Age`).
    pub(super) fn max_age_s(&self) -> u64 {
        self.ttl_ms / 1000
    }

    fn mac(&self, label: &[u8], data: &[u8]) -> String {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        m.update(label);
        m.update(&[0]);
        m.update(data);
        hex(&m.finalize().into_bytes())
    }

    fn fingerprint(&self, k: &KeyIdentity) -> String {
        let mut fp = self.mac(b"key", &k.digest);
        fp.truncate(32);
        fp
    }

    /// Checks `api_key` as a gRPC call's key would be checked and, when it is accepted and has
    /// the `admin` role (or auth is off), returns a new session cookie value.
    pub(super) fn login(&self, api_key: &str, now_ms: i64) -> Result<String, LoginRefusal> {
        let who = if self.auth.is_on() {
            let k = self
                .auth
                .identify(api_key)
                .ok_or(LoginRefusal::UnknownKey)?;
            if !k.roles.contains(&Role::Admin) {
                return Err(LoginRefusal::NotAdmin(k.name));
            }
            self.fingerprint(&k)
        } else {
            "-".to_string()
        };
        let expires = now_ms.saturating_add(i64::try_from(self.ttl_ms).unwrap_or(i64::MAX));
        let nonce = &uuid::Uuid::new_v4().simple().to_string()[..16];
        let body = format!("v1.{who}.{expires}.{nonce}");
        let sig = self.mac(b"session", body.as_bytes());
        Ok(format!("{body}.{sig}"))
    }

    /// The session `cookie` opens at `now_ms`.
    pub(super) fn check(&self, cookie: &str, now_ms: i64) -> Result<Session, Refusal> {
        let (body, sig) = cookie.rsplit_once('.').ok_or(Refusal::Invalid)?;
        if !same(&self.mac(b"session", body.as_bytes()), sig) {
            return Err(Refusal::Invalid);
        }
        let mut parts = body.split('.');
        let (Some("v1"), Some(who), Some(expires), Some(_nonce), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Refusal::Invalid);
        };
        let expires: i64 = expires.parse().map_err(|_| Refusal::Invalid)?;
        if now_ms >= expires {
            return Err(Refusal::Expired);
        }
        if self.auth.is_on() {
            // Every accepted key is compared, whatever matched, so timing does not say which.
            let mut found: Option<KeyIdentity> = None;
            for k in self.auth.accepted() {
                if same(&self.fingerprint(&k), who) {
                    found = Some(k);
                }
            }
            let k = found.ok_or(Refusal::KeyGone)?;
            if !k.roles.contains(&Role::Admin) {
                return Err(Refusal::NotAdmin(k.name));
            }
        } else if who != "-" {
            return Err(Refusal::Invalid);
        }
        Ok(Session {
            csrf: self.mac(b"csrf", body.as_bytes()),
        })
    }

    /// Whether `token` is `session`'s CSRF token.
    pub(super) fn csrf_ok(session: &Session, token: &str) -> bool {
        same(&session.csrf, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKey, AuthConfig};

    const NOW: i64 = 1_800_000_000_000;

    fn key(name: &str, secret: &str, roles: Vec<Role>) -> ApiKey {
        ApiKey {
            roles,
            ..ApiKey::new(name, secret)
        }
    }

    fn sessions(auth: ApiKeyAuth) -> Sessions {
        Sessions::new(Some(&SessionSecret::new("s".repeat(32))), 3_600_000, auth)
    }

    fn inline(keys: Vec<ApiKey>) -> ApiKeyAuth {
        ApiKeyAuth::from_config(&AuthConfig {
            api_keys: Some(keys),
            ..AuthConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn an_admin_key_opens_a_session_that_holds_no_secret() {
        let s = sessions(inline(vec![ApiKey::new("ops", "the-secret-key")]));
        let c = s.login("the-secret-key", NOW).unwrap();
        assert!(!c.contains("the-secret-key"), "{c}");
        assert!(!c.contains("ops"), "{c}");
        let got = s.check(&c, NOW + 1).unwrap();
        assert!(Sessions::csrf_ok(&got, &got.csrf));
        assert!(!Sessions::csrf_ok(&got, &"0".repeat(64)));
        // Two logins are two sessions with two CSRF tokens.
        let other = s
            .check(&s.login("the-secret-key", NOW).unwrap(), NOW)
            .unwrap();
        assert_ne!(other.csrf, got.csrf);
    }

    #[test]
    fn unknown_and_non_admin_keys_cannot_log_in() {
        let s = sessions(inline(vec![
            ApiKey::new("ops", "admin-key"),
            key("app", "producer-key", vec![Role::Producer, Role::Worker]),
        ]));
        assert_eq!(s.login("nope", NOW), Err(LoginRefusal::UnknownKey));
        assert_eq!(
            s.login("producer-key", NOW),
            Err(LoginRefusal::NotAdmin("app".into()))
        );
        assert!(not_admin("app").contains("\"admin\""));
    }

    #[test]
    fn a_tampered_expired_or_foreign_cookie_is_refused() {
        let s = sessions(inline(vec![ApiKey::new("ops", "admin-key")]));
        let c = s.login("admin-key", NOW).unwrap();
        // Move the expiry a day out: the signature no longer matches.
        let parts: Vec<&str> = c.split('.').collect();
        let later = format!(
            "{}.{}.{}.{}.{}",
            parts[0],
            parts[1],
            NOW + 86_400_000,
            parts[3],
            parts[4]
        );
        assert_eq!(s.check(&later, NOW).err(), Some(Refusal::Invalid));
        let mut flipped = c.clone();
        let last = flipped.pop().unwrap();
        flipped.push(if last == '0' { '1' } else { '0' });
        assert_eq!(s.check(&flipped, NOW).err(), Some(Refusal::Invalid));
        for junk in ["", ".", "v1", "admin-key", "v1.-.1.2.3"] {
            assert_eq!(s.check(junk, NOW).err(), Some(Refusal::Invalid), "{junk}");
        }
        assert_eq!(s.check(&c, NOW + 3_600_000).err(), Some(Refusal::Expired));
        // Another server with another secret does not accept it; one with the same does.
        let other = Sessions::new(
            Some(&SessionSecret::new("t".repeat(32))),
            3_600_000,
            inline(vec![ApiKey::new("ops", "admin-key")]),
        );
        assert_eq!(other.check(&c, NOW).err(), Some(Refusal::Invalid));
        let twin = sessions(inline(vec![ApiKey::new("ops", "admin-key")]));
        assert!(twin.check(&c, NOW).is_ok());
    }

    #[test]
    fn a_session_ends_when_its_key_is_removed_or_loses_the_admin_role() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(
            &path,
            "[[api_keys]]\nname = \"ops\"\nkey = \"k1\"\n[[api_keys]]\nname = \"ops2\"\nkey = \"k2\"\n",
        )
        .unwrap();
        let auth = ApiKeyAuth::from_config(&AuthConfig {
            api_keys_file: Some(path.clone()),
            rotation_overlap_ms: 0,
            ..AuthConfig::default()
        })
        .unwrap();
        let s = sessions(auth.clone());
        let c1 = s.login("k1", NOW).unwrap();
        let c2 = s.login("k2", NOW).unwrap();
        assert!(s.check(&c1, NOW).is_ok());
        std::fs::write(
            &path,
            "[[api_keys]]\nname = \"ops2\"\nkey = \"k2\"\nroles = [\"worker\"]\n",
        )
        .unwrap();
        auth.reload().unwrap();
        assert_eq!(s.check(&c1, NOW).err(), Some(Refusal::KeyGone));
        assert_eq!(
            s.check(&c2, NOW).err(),
            Some(Refusal::NotAdmin("ops2".into()))
        );
    }

    #[test]
    fn without_auth_a_login_still_makes_a_signed_session() {
        let s = sessions(ApiKeyAuth::from_config(&AuthConfig::default()).unwrap());
        let c = s.login("", NOW).unwrap();
        assert!(s.check(&c, NOW).is_ok());
        // A session issued while auth was on is not valid once it is off, and the reverse.
        let on = sessions(inline(vec![ApiKey::new("ops", "admin-key")]));
        assert!(on.check(&c, NOW).is_err());
        assert!(s.check(&on.login("admin-key", NOW).unwrap(), NOW).is_err());
    }
}
