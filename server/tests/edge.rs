//! The gRPC edge: API keys, the health service, server reflection, TLS.

mod common;

use common::{Clients, TestServer};
use sepp_proto::v1 as pb;
use sepp_server::config::ApiKey;
use tonic::Code;
use tonic::metadata::MetadataValue;

async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn info_request(auth: Option<&str>) -> tonic::Request<pb::GetServerInfoRequest> {
    let mut r = tonic::Request::new(pb::GetServerInfoRequest {});
    if let Some(a) = auth {
        r.metadata_mut()
            .insert("authorization", MetadataValue::try_from(a).unwrap());
    }
    r
}

#[tokio::test]
async fn api_keys_gate_every_sepp_call() {
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![ApiKey::new("producer", "s3cret")]);
    })
    .await;
    let mut raw = server.raw().await;
    for bad in [
        None,
        Some("Bearer wrong"),
        Some("s3cret"),
        Some("Basic s3cret"),
    ] {
        let e = raw.get_server_info(info_request(bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{bad:?}");
    }
    raw.get_server_info(info_request(Some("Bearer s3cret")))
        .await
        .expect("the right key is accepted");
    let mut enqueue = tonic::Request::new(pb::EnqueueBatchRequest {
        jobs: vec![pb::EnqueueRequest {
            queue: "q".into(),
            job_type: "t".into(),
            ..Default::default()
        }],
    });
    assert_eq!(
        raw.enqueue_batch(enqueue).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    enqueue = tonic::Request::new(pb::EnqueueBatchRequest { jobs: vec![] });
    enqueue
        .metadata_mut()
        .insert("authorization", MetadataValue::from_static("Bearer s3cret"));
    // Authenticated, then refused for being empty: auth comes first.
    assert_eq!(
        raw.enqueue_batch(enqueue).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // The client core sends the key it is given.
    let client = sepp_rs::SeppClient::builder(server.url())
        .api_key("s3cret")
        .connect()
        .await
        .expect("connect with key");
    client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .expect("enqueue with key");
    let err = sepp_rs::SeppClient::builder(server.url())
        .api_key("nope")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.code(), sepp_rs::ErrorCode::Unauthenticated);
}

#[tokio::test]
async fn an_empty_key_list_refuses_everything() {
    let server = TestServer::start(|c| c.auth.api_keys = Some(vec![])).await;
    let mut raw = server.raw().await;
    let e = raw
        .get_server_info(info_request(Some("Bearer anything")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn health_reports_the_queue_service_serving_without_a_key() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let server = TestServer::start(|c| c.auth.api_keys = Some(vec![])).await;
    let mut health = HealthClient::new(channel(&server).await);
    let status = health
        .check(HealthCheckRequest {
            service: "sepp.v1.QueueService".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
}

#[tokio::test]
async fn reflection_lists_the_services_and_serves_their_descriptors() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let server = TestServer::start(|_| {}).await;
    let mut client = ServerReflectionClient::new(channel(&server).await);
    let requests = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "sepp.v1.QueueService".into(),
            )),
        },
    ];
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap().message_response;
    let Some(MessageResponse::ListServicesResponse(list)) = first else {
        panic!("expected a service list, got {first:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"sepp.v1.QueueService".to_string()),
        "{names:?}"
    );
    let second = stream.message().await.unwrap().unwrap().message_response;
    let Some(MessageResponse::FileDescriptorResponse(fd)) = second else {
        panic!("expected a file descriptor, got {second:?}");
    };
    assert!(!fd.file_descriptor_proto.is_empty());
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_certificate() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let server = TestServer::start(|c| {
        c.server.tls_cert_path = Some(cert_path.clone());
        c.server.tls_key_path = Some(key_path.clone());
    })
    .await;
    let url = format!("https://localhost:{}", server.addr.port());
    let client = sepp_rs::SeppClient::builder(url)
        .tls(sepp_rs::client::TlsOptions {
            ca_pem: Some(cert.cert.pem().into_bytes()),
            domain: Some("localhost".into()),
            ..Default::default()
        })
        .connect()
        .await
        .expect("tls connect");
    let ack = client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .expect("enqueue over tls");
    assert!(!ack.deduplicated);
    // A plaintext client cannot talk to it.
    let plain = sepp_rs::SeppClient::builder(server.url())
        .connect_timeout(std::time::Duration::from_secs(2))
        .rpc_timeout(Some(std::time::Duration::from_secs(2)))
        .connect()
        .await;
    assert!(plain.is_err());
}

#[tokio::test]
async fn reflection_answers_each_request_while_the_stream_stays_open() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    let server = TestServer::start(|_| {}).await;
    let mut client = ServerReflectionClient::new(channel(&server).await);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    })
    .await
    .unwrap();
    let call = client.server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut stream = tokio::time::timeout(std::time::Duration::from_secs(3), call)
        .await
        .expect("the call is answered while its request stream is open")
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(3), stream.message())
        .await
        .expect("the first request is answered before the stream ends");
    assert!(first.unwrap().is_some());
    drop(tx);
}
