//! Compiles `sepp/**/*.proto` with protox (pure Rust, so no system `protoc` is needed) and
//! generates prost types plus tonic client and server stubs. The encoded descriptor set is
//! written next to the generated code so that the server can offer gRPC reflection.
//!
//! Two passes: the messages and client stubs into `OUT_DIR`, then the server stubs alone into
//! `OUT_DIR/server` (the messages named as extern paths into the first pass), because the
//! server stubs use their own codec ([`crate::codec::RequestCodec`]) and tonic-prost-build
//! has one codec setting per pass.

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
        .build_server(false)
        .compile_fds(fds.clone())?;
    let server_out = out.join("server");
    std::fs::create_dir_all(&server_out)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .codec_path("crate::codec::RequestCodec")
        .extern_path(".sepp.v1", "crate::v1")
        .extern_path(".sepp.admin.v1", "crate::admin::v1")
        .out_dir(&server_out)
        .compile_fds(fds)?;
    // Without the `server` feature the second pass may write nothing; lib.rs includes both.
    for f in ["sepp.v1.rs", "sepp.admin.v1.rs"] {
        let p = server_out.join(f);
        if !p.exists() {
            std::fs::write(p, "")?;
        }
    }
    Ok(())
}
