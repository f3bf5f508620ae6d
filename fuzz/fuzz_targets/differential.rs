//! Fuzz target `differential`: see `ringrpc::fuzzing::check_differential` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_differential(data));
