//! Helpers shared by this crate's integration tests, over `sepp_server::testing`.
#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    missing_docs,
    async_fn_in_trait
)]

pub mod pg_cluster;

use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use sepp_rs::client::SeppClient;
use std::path::{Path, PathBuf};
use tonic::transport::Channel;

pub use sepp_server::testing::{TempDir, TestServer};

/// The `sepp` binary of this build.
pub fn sepp_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sepp"))
}

/// Starts this build's binary.
pub struct ServerProcess;

impl ServerProcess {
    pub fn start(dir: &Path, toml: &str) -> sepp_server::testing::ServerProcess {
        sepp_server::testing::ServerProcess::start(&sepp_bin(), dir, toml)
    }
}

pub trait Clients {
    fn url(&self) -> String;
    async fn client(&self) -> SeppClient {
        SeppClient::connect(self.url()).await.expect("connect")
    }
    async fn raw(&self) -> QueueServiceClient<Channel> {
        QueueServiceClient::connect(self.url())
            .await
            .expect("connect raw")
    }
    async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::connect(self.url())
            .await
            .expect("connect admin")
    }
}

impl Clients for TestServer {
    fn url(&self) -> String {
        TestServer::url(self)
    }
}
