//! Image files decoded and preprocessed as `image-folder` does; the first
//! byte picks grayscale (bit 0) and resizing (bit 1).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&mode, bytes)) = data.split_first() {
        let _ = fedweave_data::fuzzing::image(bytes, mode & 1 == 1, mode & 2 == 2);
    }
});
