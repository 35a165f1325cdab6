//! Recovery: a data directory (a job in every stage, keyed and unkeyed, a paused queue) with
//! arbitrary bytes in one record, opened by the embedded store and used.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sepp_server::testing::fuzz::recovery(data);
});
