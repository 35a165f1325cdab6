//! Mutual TLS: with `server.tls_client_ca_path` set, a client must present a certificate
//! signed by that CA. Certificates are made at test time with rcgen.

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

struct Tls {
    server: TestServer,
    server_ca_pem: String,
    _dir: tempfile::TempDir,
}

async fn server_with_client_ca(client_ca_pem: &str) -> Tls {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    let ca_path = dir.path().join("client-ca.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(&ca_path, client_ca_pem).unwrap();
    let server = TestServer::start(|c| {
        c.server.tls_cert_path = Some(cert_path.clone());
        c.server.tls_key_path = Some(key_path.clone());
        c.server.tls_client_ca_path = Some(ca_path.clone());
    })
    .await;
    Tls {
        server,
        server_ca_pem: cert.cert.pem(),
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

#[tokio::test]
async fn a_client_without_a_certificate_is_refused_and_one_with_a_signed_certificate_works() {
    let ca = make_ca("sepp test client CA");
    let tls = server_with_client_ca(&ca.pem()).await;

    let e = enqueue(&tls, None)
        .await
        .expect_err("a client without a certificate is refused");
    assert_eq!(e.0, sepp_rs::ErrorCode::Transport, "{e:?}");

    let other = make_ca("some other CA");
    enqueue(&tls, Some(client_cert(&other)))
        .await
        .expect_err("a certificate from another CA is refused");

    enqueue(&tls, Some(client_cert(&ca)))
        .await
        .expect("a certificate signed by the client CA is accepted");
}

#[tokio::test]
async fn a_client_certificate_without_its_key_is_an_invalid_config() {
    let ca = make_ca("sepp test client CA");
    let tls = server_with_client_ca(&ca.pem()).await;
    let (cert, _) = client_cert(&ca);
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

#[test]
fn a_client_ca_without_tls_is_refused_by_the_config() {
    let text = "[server]\ntls_client_ca_path = \"/tmp/ca.pem\"\n";
    let e = sepp_server::config::Config::from_toml_with_env(text, &[])
        .and_then(|l| l.config.validate())
        .unwrap_err();
    assert!(e.to_string().contains("server.tls_client_ca_path"), "{e}");
}
