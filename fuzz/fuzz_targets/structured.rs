//! Fuzz target `structured`: valid and near-valid requests and batches generated with
//! `arbitrary` (see `ringrpc_fuzz::Input`), rendered to JSON text and checked like the
//! `differential` and `engine` targets, so dispatch and the serializer are reached.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: ringrpc_fuzz::Input| {
    let frame = input.render();
    ringrpc::fuzzing::check_differential(&frame);
    ringrpc::fuzzing::check_engine(&frame);
});
