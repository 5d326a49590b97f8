//! PFLlib client files (`.npz` with a pickled `{'x', 'y'}` dict, or plain
//! `x.npy` / `y.npy` members).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedweave_data::fuzzing::pfllib(data);
});
