//! Every request the kernel (or a journal replayed after a handover) can
//! hand fuse-wire: the decoder must answer a typed request or a
//! `DecodeError`, never panic or read out of bounds. The first byte picks
//! the negotiated options.
#![no_main]

use fuse_wire::{DecodeOptions, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&options, raw)) = data.split_first() else {
        return;
    };
    let options = DecodeOptions {
        setxattr_ext: options & 1 == 1,
    };
    if let Ok(request) = Request::parse(raw, options) {
        // Formatting reads every decoded field (names, payloads, lengths).
        let _ = format!("{request:?}");
    }
});
