//! Compiles `sepp/**/*.proto` with protox (pure Rust, so no system `protoc` is needed) and
//! generates prost types plus tonic client and server stubs. The encoded descriptor set is
//! written next to the generated code so that the server can offer gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["sepp/v1/queue.proto", "sepp/admin/v1/admin.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sepp_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(std::env::var_os("CARGO_FEATURE_CLIENT").is_some())
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .compile_fds(fds)?;
    Ok(())
}
