//! The embedded store's on-disk records: `data[0]` even decodes the rest as a record (never a
//! panic; a record that decodes survives its own encoding), odd builds a record from the rest
//! and checks that decode of encode is the identity.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sepp_server::testing::fuzz::codec_target(data);
});
