//! Fuzz target `engine`: see `ringrpc::fuzzing::check_engine` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_engine(data));
