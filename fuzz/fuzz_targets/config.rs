//! The configuration loader: a TOML file, then after a NUL byte one environment variable per
//! line (`SECTION__FIELD=value`, loaded as `SEPP_SECTION__FIELD`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sepp_server::testing::fuzz::config_target(data);
});
