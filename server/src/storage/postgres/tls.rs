//! TLS to PostgreSQL: the one place that turns `storage.postgres_url` and
//! `storage.postgres_ca_file` into connection settings and a rustls connector
//! (tokio-postgres-rustls over the ring provider the gRPC server uses; no second TLS stack).
//! Every connection sepp opens to PostgreSQL (the migrations, the pool, the `LISTEN`
//! connection) is made with what [`connection`] returns.
//!
//! `sslmode` follows libpq:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | when the server offers it | as `require` |
//! | `require` | always (refused when the server has no TLS) | not verified without `postgres_ca_file` (encrypted, not authenticated, as libpq); with it, its chain is verified as `verify-ca` (as libpq with a root certificate) |
//! | `verify-ca` | always | chain verified against `postgres_ca_file` (needed), host name not checked |
//! | `verify-full` | always | chain verified against `postgres_ca_file` (needed), and the host name (or IP address) in the URL must be in its subject alternative names |
//!
//! tokio-postgres itself knows `disable`, `prefer` and `require` only: `verify-ca` and
//! `verify-full` are read here and handed to it as `require`, the verification being this
//! module's.

use crate::storage::StorageError;
use std::path::Path;
use std::sync::Arc;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

// The connection string's parsing belongs to the config (it checks `storage.postgres_url` at
// load, and config imports nothing from storage/).
pub(crate) use crate::config::{PostgresVerify as Verify, parse_postgres_url as parse_url};

/// The connection settings and the TLS connector every PostgreSQL connection of sepp uses.
///
/// # Errors
/// [`StorageError::Io`] for a bad connection string, a CA file that cannot be read or holds no
/// PEM certificate, or `verify-ca`/`verify-full` without a CA file; the message names the
/// database (host, port, database, user; never the password).
pub(crate) fn connection(
    url: &str,
    ca_file: Option<&Path>,
) -> Result<(tokio_postgres::Config, MakeRustlsConnect), StorageError> {
    let (cfg, verify) = parse_url(url).map_err(|e| {
        StorageError::Io(format!(
            "storage.postgres_url is not a valid connection string: {e}"
        ))
    })?;
    let place = super::schema::describe(&cfg);
    let bad = |what: String| StorageError::Io(format!("PostgreSQL ({place}): {what}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match ca_file {
        None => None,
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                bad(format!(
                    "cannot read storage.postgres_ca_file {}: {e}",
                    path.display()
                ))
            })?;
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| {
                    bad(format!(
                        "storage.postgres_ca_file {}: not a PEM certificate: {e}",
                        path.display()
                    ))
                })?;
                roots.add(c).map_err(|e| {
                    bad(format!("storage.postgres_ca_file {}: {e}", path.display()))
                })?;
            }
            if roots.is_empty() {
                return Err(bad(format!(
                    "storage.postgres_ca_file {}: no PEM certificate in it",
                    path.display()
                )));
            }
            Some(Arc::new(roots))
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("cannot set up TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (roots, verify) {
        (None, Verify::Ca | Verify::Full) => {
            return Err(bad(
                "sslmode=verify-ca and sslmode=verify-full need storage.postgres_ca_file (the \
                 PEM certificate of the CA that signed the server's certificate)"
                    .into(),
            ));
        }
        (None, Verify::Libpq) => {
            if cfg.get_ssl_mode() != SslMode::Disable {
                tracing::warn!(
                    database = %place,
                    "PostgreSQL TLS without storage.postgres_ca_file: the connection is \
                     encrypted when TLS is used, but the server's certificate is not verified; \
                     set storage.postgres_ca_file and sslmode=verify-full to authenticate it"
                );
            }
            Arc::new(Unverified(provider))
        }
        (Some(roots), v) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| bad(format!("storage.postgres_ca_file: {e}")))?;
            if v == Verify::Full {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok((cfg, MakeRustlsConnect::new(config)))
}

/// `verify-ca`: the chain must lead to the CA; the name in the certificate is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain before the name: a name error means the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer`/`require` without a CA file (libpq's behaviour): the certificate is not checked;
/// the handshake signatures still are, so the session is encrypted to whoever holds the key of
/// the certificate shown.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_are_read_and_handed_on_as_require() {
        for (url, verify, mode) in [
            ("postgres://u@h/db", Verify::Libpq, SslMode::Prefer),
            (
                "postgres://u@h/db?sslmode=disable",
                Verify::Libpq,
                SslMode::Disable,
            ),
            (
                "postgres://u@h/db?sslmode=require",
                Verify::Libpq,
                SslMode::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-ca",
                Verify::Ca,
                SslMode::Require,
            ),
            (
                "host=h user=u sslmode=verify-full",
                Verify::Full,
                SslMode::Require,
            ),
        ] {
            let (cfg, v) = parse_url(url).expect(url);
            assert_eq!((v, cfg.get_ssl_mode()), (verify, mode), "{url}");
        }
        assert!(parse_url("postgres://u@h/db?sslmode=bogus").is_err());
    }

    #[test]
    fn verify_full_without_a_ca_file_is_refused_naming_the_key_and_database() {
        let Err(e) = connection("postgres://u:secret@h:5433/db?sslmode=verify-full", None) else {
            panic!("accepted");
        };
        let e = e.to_string();
        assert!(e.contains("storage.postgres_ca_file"), "{e}");
        assert!(e.contains("host h, port 5433, database db, user u"), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").expect("write");
        let Err(e) = connection("postgres://u@h/db?sslmode=verify-full", Some(&path)) else {
            panic!("accepted");
        };
        let e = e.to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        assert!(e.contains("database db"), "{e}");
    }
}
