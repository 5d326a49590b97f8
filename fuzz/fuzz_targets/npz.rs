//! `.npz` archives (zip of `.npy` members) read as the us-weather dataset.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedweave_data::fuzzing::npz(data);
});
