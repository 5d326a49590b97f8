//! IDX images/labels files, raw or gzip: any input gives Ok or a DataError.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedweave_data::fuzzing::idx(data);
});
