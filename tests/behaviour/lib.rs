//! The cross-language behaviour suite: `scenarios.json` is run by three runners, one per client
//! language (`src/bin/behaviour_runner.rs`, `runner.py`, `runner.mjs`), against one real server
//! that `tests/cross_language.rs` starts; their records must be identical. This crate has no
//! library code.
