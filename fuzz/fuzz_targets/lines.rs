//! Fuzz target `lines`: see `ringrpc::fuzzing::check_lines` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_lines(data));
