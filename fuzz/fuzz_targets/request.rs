//! One RPC's request message from arbitrary bytes, decoded and handled by the gRPC edge
//! (conversion, then the queue layer's validation) over a store that holds nothing:
//! `data[0]` picks the RPC and one of two configurations, the rest is the message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sepp_server::testing::fuzz::request_target(data);
});
