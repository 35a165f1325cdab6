//! The sepp wire protocol, generated from `proto/sepp/**/*.proto` at build time.
//!
//! - [`v1`]: `sepp.v1`, the public job-queue protocol (`QueueService`).
//! - [`admin::v1`]: `sepp.admin.v1`, sepp's operator API (`AdminService`).
//!
//! Features: `client` generates the tonic client stubs, `server` the server stubs.
#![allow(missing_docs, unreachable_pub, clippy::all)]

/// `sepp.v1`: messages and the `QueueService` stubs.
pub mod v1 {
    tonic::include_proto!("sepp.v1");
    include!(concat!(env!("OUT_DIR"), "/server/sepp.v1.rs"));
}

/// `sepp.admin.*`: the operator API.
pub mod admin {
    /// `sepp.admin.v1`: messages and the `AdminService` stubs.
    pub mod v1 {
        tonic::include_proto!("sepp.admin.v1");
        include!(concat!(env!("OUT_DIR"), "/server/sepp.admin.v1.rs"));
    }
}

#[cfg(feature = "server")]
pub mod codec;

/// The encoded `FileDescriptorSet` of every sepp proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sepp_descriptor.bin"));

/// Well-known protobuf types used by the messages (`Timestamp`, `Duration`, `Empty`).
pub use prost_types;

/// The range of `google.protobuf.Duration` in seconds, either way: about 10 000 years.
pub const DURATION_MAX_SECONDS: i64 = 315_576_000_000;
