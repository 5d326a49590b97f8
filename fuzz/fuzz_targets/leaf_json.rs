//! LEAF JSON files, as FEMNIST and as Shakespeare.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedweave_data::fuzzing::leaf(data, true);
    let _ = fedweave_data::fuzzing::leaf(data, false);
});
