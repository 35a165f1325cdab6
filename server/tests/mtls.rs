//! Mutual TLS: with `server.tls_client_ca_path` set, a client must present a certificate
//! signed by that CA. Certificates are made at test time with rcgen, and the same functions
//! made the committed set in `tests/fixtures/tls/` that the Python and Node tests use
//! (`write_the_shared_tls_fixtures` regenerates it; a test here checks it still works).

mod common;

use common::TestServer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use sepp_rs::client::TlsOptions;
use std::time::Duration;

/// A CA able to sign client certificates.
fn make_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A client certificate signed by `ca`: (cert PEM, key PEM).
fn client_cert(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let mut params = CertificateParams::new(vec!["worker-1".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A server certificate and the certificates of its clients, as PEM.
struct Certs {
    /// The server's self-signed certificate for `localhost`, and its key.
    server: (String, String),
    /// The CA of `server.tls_client_ca_path`.
    client_ca: String,
    /// A client certificate signed by `client_ca`, and its key.
    client: (String, String),
    /// A client certificate signed by another CA, and its key.
    other_client: (String, String),
}

impl Certs {
    /// A fresh set.
    fn generate() -> Self {
        let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let ca = make_ca("sepp test client CA");
        let other = make_ca("some other CA");
        Certs {
            server: (server.cert.pem(), server.signing_key.serialize_pem()),
            client_ca: ca.pem(),
            client: client_cert(&ca),
            other_client: client_cert(&other),
        }
    }

    const FILES: [&str; 7] = [
        "server.pem",
        "server.key",
        "client-ca.pem",
        "client.pem",
        "client.key",
        "other-client.pem",
        "other-client.key",
    ];

    fn fixture_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
    }

    fn pems(&self) -> [&str; 7] {
        [
            &self.server.0,
            &self.server.1,
            &self.client_ca,
            &self.client.0,
            &self.client.1,
            &self.other_client.0,
            &self.other_client.1,
        ]
    }

    /// The committed set.
    fn fixture() -> Self {
        let [a, b, c, d, e, f, g] = Self::FILES.map(|name| {
            std::fs::read_to_string(Self::fixture_dir().join(name))
                .unwrap_or_else(|e| panic!("tests/fixtures/tls/{name}: {e}"))
        });
        Certs {
            server: (a, b),
            client_ca: c,
            client: (d, e),
            other_client: (f, g),
        }
    }
}

struct Tls {
    server: TestServer,
    server_ca_pem: String,
    _dir: tempfile::TempDir,
}

async fn server_with_client_ca(certs: &Certs) -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    let ca_path = dir.path().join("client-ca.pem");
    std::fs::write(&cert_path, &certs.server.0).unwrap();
    std::fs::write(&key_path, &certs.server.1).unwrap();
    std::fs::write(&ca_path, &certs.client_ca).unwrap();
    let server = TestServer::start(|c| {
        c.server.tls_cert_path = Some(cert_path.clone());
        c.server.tls_key_path = Some(key_path.clone());
        c.server.tls_client_ca_path = Some(ca_path.clone());
    })
    .await;
    Tls {
        server,
        server_ca_pem: certs.server.0.clone(),
        _dir: dir,
    }
}

/// Connects with `identity` (cert, key) and enqueues one job.
async fn enqueue(
    tls: &Tls,
    identity: Option<(String, String)>,
) -> Result<(), (sepp_rs::ErrorCode, String)> {
    let (client_cert_pem, client_key_pem) = match identity {
        Some((c, k)) => (Some(c.into_bytes()), Some(k.into_bytes())),
        None => (None, None),
    };
    let client =
        sepp_rs::SeppClient::builder(format!("https://localhost:{}", tls.server.addr.port()))
            .tls(TlsOptions {
                ca_pem: Some(tls.server_ca_pem.clone().into_bytes()),
                domain: Some("localhost".into()),
                client_cert_pem,
                client_key_pem,
            })
            .connect_timeout(Duration::from_secs(5))
            .rpc_timeout(Some(Duration::from_secs(5)))
            .no_retries()
            .connect()
            .await
            .map_err(|e| (e.code(), e.to_string()))?;
    client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .map(drop)
        .map_err(|e| (e.code(), e.to_string()))
}

/// Without a certificate, or with one from another CA: refused at the handshake
/// (`Transport`); with one signed by the client CA: served.
async fn only_a_certificate_of_the_client_ca_is_served(certs: &Certs) {
    let tls = server_with_client_ca(certs).await;

    let e = enqueue(&tls, None)
        .await
        .expect_err("a client without a certificate is refused");
    assert_eq!(e.0, sepp_rs::ErrorCode::Transport, "{e:?}");

    let e = enqueue(&tls, Some(certs.other_client.clone()))
        .await
        .expect_err("a certificate from another CA is refused");
    assert_eq!(e.0, sepp_rs::ErrorCode::Transport, "{e:?}");

    enqueue(&tls, Some(certs.client.clone()))
        .await
        .expect("a certificate signed by the client CA is accepted");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused_and_one_with_a_signed_certificate_works() {
    only_a_certificate_of_the_client_ca_is_served(&Certs::generate()).await;
}

#[tokio::test]
async fn the_committed_certificates_of_the_python_and_node_tests_still_work() {
    only_a_certificate_of_the_client_ca_is_served(&Certs::fixture()).await;
}

/// Regenerates `tests/fixtures/tls/` (test-only keys, valid until 4096, rcgen's default):
/// `cargo test -p sepp-server --test mtls -- --ignored write_the_shared_tls_fixtures`.
#[test]
#[ignore = "writes tests/fixtures/tls/; run by hand to regenerate the committed set"]
fn write_the_shared_tls_fixtures() {
    let certs = Certs::generate();
    std::fs::create_dir_all(Certs::fixture_dir()).unwrap();
    for (name, pem) in Certs::FILES.iter().zip(certs.pems()) {
        std::fs::write(Certs::fixture_dir().join(name), pem).unwrap();
    }
}

#[tokio::test]
async fn a_client_certificate_without_its_key_is_an_invalid_config() {
    let certs = Certs::generate();
    let tls = server_with_client_ca(&certs).await;
    let cert = certs.client.0.clone();
    let r = sepp_rs::SeppClient::builder(format!("https://localhost:{}", tls.server.addr.port()))
        .tls(TlsOptions {
            ca_pem: Some(tls.server_ca_pem.clone().into_bytes()),
            domain: Some("localhost".into()),
            client_cert_pem: Some(cert.into_bytes()),
            client_key_pem: None,
        })
        .connect()
        .await;
    let Err(e) = r else {
        panic!("a certificate without its key is refused");
    };
    assert_eq!(e.code(), sepp_rs::ErrorCode::InvalidConfig);
    assert!(e.to_string().contains("client_key_pem"), "{e}");
}

#[tokio::test]
async fn an_https_address_of_a_plain_text_server_says_so() {
    let server = sepp_server::testing::TestServer::start(|_| {}).await;
    let r = sepp_rs::SeppClient::builder(format!("https://127.0.0.1:{}", server.addr.port()))
        .connect()
        .await;
    let Err(e) = r else {
        panic!("a TLS handshake with a plain-text server fails");
    };
    assert_eq!(e.code(), sepp_rs::ErrorCode::Transport);
    assert!(
        e.to_string()
            .contains("the server answered without TLS: for a plain-text server, use http://"),
        "{e}"
    );
}

#[test]
fn a_client_ca_without_tls_is_refused_by_the_config() {
    let text = "[server]\ntls_client_ca_path = \"/tmp/ca.pem\"\n";
    let e = sepp_server::config::Config::from_toml_with_env(text, &[])
        .and_then(|l| l.config.validate())
        .unwrap_err();
    assert!(e.to_string().contains("server.tls_client_ca_path"), "{e}");
}

/// One name per setting: the `[server.tls]` table of an early proposal is not a second
/// spelling of `server.tls_client_ca_path` (docs/security.md).
#[test]
fn a_server_tls_table_is_refused_as_an_unknown_key() {
    let text = "[server.tls]\nclient_ca_file = \"/tmp/ca.pem\"\n";
    let e = sepp_server::config::Config::from_toml_with_env(text, &[])
        .and_then(|l| l.config.validate())
        .unwrap_err();
    assert!(e.to_string().contains("unknown key `tls`"), "{e}");
}
