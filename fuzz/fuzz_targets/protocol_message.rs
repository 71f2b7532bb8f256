//! Frames on the supervisor's sockets (fsctl and the CSI plugin on the
//! control socket; generations on their own): a message or a
//! `ProtocolError`, never a panic. A decoded message encodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = upgrade_protocol::decode(data) {
        let frame = upgrade_protocol::encode(&message).expect("a decoded message encodes");
        upgrade_protocol::decode(&frame).expect("an encoded message decodes");
    }
});
