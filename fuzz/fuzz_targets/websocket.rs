//! Fuzz target `websocket`: see `ringrpc::fuzzing::check_websocket` and docs/FUZZING.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringrpc::fuzzing::check_websocket(data));
