//! Fuzz target `http`: see `ringrpc::fuzzing::check_http` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_http(data));
