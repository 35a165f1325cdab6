//! The configuration loader: a TOML file, then after a NUL byte one environment variable per
//! line (`SECTION__FIELD=value`, loaded as `SEPP_SECTION__FIELD`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (toml, env) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let toml = String::from_utf8_lossy(toml);
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("SEPP_{k}"), v.to_string()))
        .collect();
    sepp_server::testing::fuzz::config(&toml, &env);
});
