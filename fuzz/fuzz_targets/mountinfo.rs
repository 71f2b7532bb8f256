//! /proc/self/mountinfo as the supervisor's restore, the CSI plugin and
//! fsctl read it: any bytes parse into mounts or are skipped, never a
//! panic, and every path field unescapes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for mount in fuse_wire::mountinfo::parse(data) {
        let escaped = fuse_wire::mountinfo::escape(&mount.mountpoint);
        assert_eq!(fuse_wire::mountinfo::unescape(&escaped), mount.mountpoint);
    }
});
