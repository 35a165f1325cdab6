//! Sets the linker flags a Node addon needs (N-API symbols resolve at load time).

fn main() {
    napi_build::setup();
}
