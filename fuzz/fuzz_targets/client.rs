//! Fuzz target `client`: see `ringrpc::fuzzing::check_client` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_client(data));
