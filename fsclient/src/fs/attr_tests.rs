//! Attributes read without the inode's mutex (LOOKUP, GETATTR,
//! READDIRPLUS) against a flush that commits a new size and clears its
//! staged record in between: the size answered is never the older one
//! ([`BatonFs::kernel_attr`]'s `read_since`).

#![allow(clippy::unwrap_used)]

use super::fence_tests::fs_with_a_file;

#[test]
fn attributes_read_across_a_flush_show_the_size_it_committed() {
    let base = tempfile::tempdir().unwrap();
    let (fs, _lock, ino) = fs_with_a_file(base.path());
    fs.truncate(ino, 1000).unwrap();
    fs.flush_inode(ino).unwrap();
    // A write that grows the file, staged only.
    let write = fuse_wire::WriteIn {
        offset: 500_000,
        size: 5,
        ..Default::default()
    };
    fs.do_write(ino, &write, b"hello", super::namespace::Caller::root())
        .unwrap();
    assert!(fs.staging.staged_size(ino).unwrap().is_some());

    // GETATTR reads the committed attributes (1000 bytes) ...
    let token = fs.committed_bytes.token();
    let stale = fs.meta.getattr(ino).unwrap();
    assert_eq!(stale.size, 1000);
    // ... a flush commits 500,005 bytes and clears the record ...
    fs.flush_inode(ino).unwrap();
    assert_eq!(fs.staging.staged_size(ino).unwrap(), None);
    // ... and only then does the reply look at staging.
    let answered = fs.attr_out_with(&stale, None, Some(token)).unwrap();
    assert_eq!(
        answered.attr.size, 500_005,
        "the size from before the flush"
    );
    let entry = fs.entry_out_with(&stale, None, Some(token)).unwrap();
    assert_eq!(entry.attr.size, 500_005);
}
