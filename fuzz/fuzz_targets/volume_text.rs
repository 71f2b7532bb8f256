//! What operators type: volume strings (names, sqlite: and postgres: URLs)
//! and sizes. A parse or a reason, never a panic. (That a password never
//! appears in a message is a property test: upgrade-protocol's volume_spec.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match upgrade_protocol::VolumeSpec::parse(text) {
        Ok(spec) => {
            let _ = (spec.display(), spec.short_name(), spec.mount_source());
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
    let _ = upgrade_protocol::parse_size(text);
});
