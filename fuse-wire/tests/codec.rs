//! Decode and encode without a kernel: requests built byte by byte decode to
//! the right operation, malformed ones are refused with the unique to answer,
//! and reply bytes are pinned by snapshots (a changed snapshot is a wire
//! format change).

use std::ffi::OsStr;
use std::io::IoSlice;
use std::sync::{Arc, Mutex};

use fuse_wire::abi::{self, opcode};
use fuse_wire::reply::{
    DirentBuf, DirentRecord, ReplyAttr, ReplyChannel, ReplyCreate, ReplyData, ReplyEntry,
    ReplyWrite,
};
use fuse_wire::{
    DecodeError, DecodeOptions, Errno, FileHandle, FopenFlags, InitConfig, NodeId, OpenInFlags,
    Operation, RenameFlags, Request,
};
use zerocopy::IntoBytes;

/// Builds a request: header (with `len` filled in), then the body parts.
fn request(op: u32, unique: u64, nodeid: u64, parts: &[&[u8]]) -> Vec<u8> {
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let header = abi::InHeader {
        len: (40 + body_len) as u32,
        opcode: op,
        unique,
        nodeid: NodeId::new(nodeid),
        uid: 1000,
        gid: 100,
        pid: 42,
        ..Default::default()
    };
    let mut out = header.as_bytes().to_vec();
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

fn parse(raw: &[u8]) -> Result<Request<'_>, DecodeError> {
    Request::parse(raw, DecodeOptions { setxattr_ext: true })
}

#[test]
fn lookup_decodes_name_unique_and_caller() {
    let raw = request(opcode::LOOKUP, 7, 1, &[b"file.txt\0"]);
    let req = parse(&raw).expect("decode");
    assert_eq!(
        req.operation(),
        &Operation::Lookup {
            name: OsStr::new("file.txt")
        }
    );
    assert_eq!(
        (req.unique(), req.nodeid().get(), req.caller()),
        (7, 1, (1000, 100, 42))
    );
    assert_eq!(req.raw(), &raw[..], "raw bytes are kept for the journal");
    assert!(!req.is_resend());
}

#[test]
fn resent_unique_keeps_bit_63_and_masks_it_for_keys() {
    let unique = 0x8 | abi::UNIQUE_RESEND;
    let raw = request(
        opcode::GETATTR,
        unique,
        2,
        &[abi::GetattrIn::default().as_bytes()],
    );
    let req = parse(&raw).expect("decode");
    assert_eq!(
        req.unique(),
        unique,
        "replies must carry the unique as read"
    );
    assert_eq!(req.key(), 0x8);
    assert!(req.is_resend());
}

#[test]
fn write_decodes_its_payload() {
    let arg = abi::WriteIn {
        fh: FileHandle::new(3),
        offset: 4096,
        size: 5,
        ..Default::default()
    };
    let raw = request(opcode::WRITE, 9, 2, &[arg.as_bytes(), b"hello"]);
    match parse(&raw).expect("decode").operation() {
        Operation::Write { arg: got, data } => {
            assert_eq!((got.fh.get(), got.offset, *data), (3, 4096, &b"hello"[..]))
        }
        other => panic!("decoded as {other:?}"),
    }
}

#[test]
fn rename2_symlink_and_setxattr_decode_both_names() {
    let arg = abi::Rename2In {
        newdir: NodeId::new(5),
        flags: RenameFlags::from_bits_retain(libc::RENAME_NOREPLACE),
        padding: 0,
    };
    let raw = request(opcode::RENAME2, 1, 2, &[arg.as_bytes(), b"a\0", b"b\0"]);
    assert_eq!(
        parse(&raw).expect("decode").operation(),
        &Operation::Rename {
            newdir: NodeId::new(5),
            flags: RenameFlags::NOREPLACE,
            name: OsStr::new("a"),
            newname: OsStr::new("b")
        }
    );
    let raw = request(opcode::SYMLINK, 1, 2, &[b"link\0", b"/target\0"]);
    assert_eq!(
        parse(&raw).expect("decode").operation(),
        &Operation::Symlink {
            name: OsStr::new("link"),
            target: OsStr::new("/target")
        }
    );
    let arg = abi::SetxattrIn {
        size: 3,
        flags: 1,
        ..Default::default()
    };
    let raw = request(
        opcode::SETXATTR,
        1,
        2,
        &[arg.as_bytes(), b"user.k\0", b"v\0x"],
    );
    match parse(&raw).expect("decode").operation() {
        Operation::Setxattr { name, value, .. } => {
            assert_eq!((*name, *value), (OsStr::new("user.k"), &b"v\0x"[..]))
        }
        other => panic!("decoded as {other:?}"),
    }
}

#[test]
fn setxattr_without_ext_uses_the_8_byte_header() {
    let raw = request(
        opcode::SETXATTR,
        1,
        2,
        &[&2u32.to_le_bytes(), &0u32.to_le_bytes(), b"user.k\0", b"ok"],
    );
    let req = Request::parse(
        &raw,
        DecodeOptions {
            setxattr_ext: false,
        },
    )
    .expect("decode");
    match req.operation() {
        Operation::Setxattr { name, value, .. } => {
            assert_eq!((*name, *value), (OsStr::new("user.k"), &b"ok"[..]))
        }
        other => panic!("decoded as {other:?}"),
    }
}

#[test]
fn batch_forget_decodes_every_node() {
    let head = abi::BatchForgetIn { count: 2, dummy: 0 };
    let a = abi::ForgetOne {
        nodeid: NodeId::new(5),
        nlookup: 1,
    };
    let b = abi::ForgetOne {
        nodeid: NodeId::new(6),
        nlookup: 3,
    };
    let raw = request(
        opcode::BATCH_FORGET,
        1,
        0,
        &[head.as_bytes(), a.as_bytes(), b.as_bytes()],
    );
    assert_eq!(
        parse(&raw).expect("decode").operation(),
        &Operation::BatchForget { nodes: vec![a, b] }
    );
}

#[test]
fn supplementary_groups_come_from_the_extension_area() {
    let arg = abi::CreateIn {
        flags: 0,
        mode: 0o644,
        umask: 0o22,
        open_flags: OpenInFlags::empty(),
    };
    // ext header (8) + nr_groups (4) + 1 group (4) = 16 bytes = 2 units.
    let ext = abi::ExtHeader {
        size: 16,
        typ: abi::EXT_GROUPS,
    };
    let mut raw = request(
        opcode::CREATE,
        1,
        1,
        &[
            arg.as_bytes(),
            b"f\0",
            &[0u8; 6],
            ext.as_bytes(),
            &1u32.to_le_bytes(),
            &77u32.to_le_bytes(),
        ],
    );
    raw[36..38].copy_from_slice(&2u16.to_le_bytes()); // total_extlen
    let req = parse(&raw).expect("decode");
    assert_eq!(req.supplementary_groups(), vec![77]);
    assert!(matches!(req.operation(), Operation::Create { name, .. } if *name == OsStr::new("f")));
}

#[test]
fn unknown_opcodes_decode_as_unknown() {
    let raw = request(4000, 1, 1, &[]);
    assert_eq!(
        parse(&raw).expect("decode").operation(),
        &Operation::Unknown { opcode: 4000 }
    );
}

#[test]
fn malformed_requests_are_refused_with_the_unique_to_answer() {
    assert_eq!(
        parse(&[0u8; 12]).unwrap_err(),
        DecodeError::ShortHeader { len: 12 }
    );
    assert_eq!(parse(&[0u8; 12]).unwrap_err().unique(), None);

    let mut raw = request(opcode::LOOKUP, 11, 1, &[b"name\0"]);
    raw.truncate(raw.len() - 2);
    let err = parse(&raw).unwrap_err();
    assert!(
        matches!(err, DecodeError::LengthMismatch { unique: 11, .. }),
        "{err:?}"
    );

    let raw = request(opcode::LOOKUP, 12, 1, &[b"no-terminator"]);
    assert!(matches!(
        parse(&raw).unwrap_err(),
        DecodeError::Truncated {
            unique: 12,
            what: "name",
            ..
        }
    ));

    let raw = request(opcode::READ, 13, 1, &[&[0u8; 10]]);
    assert_eq!(parse(&raw).unwrap_err().unique(), Some(13));

    let arg = abi::WriteIn {
        size: 100,
        ..Default::default()
    };
    let raw = request(opcode::WRITE, 14, 1, &[arg.as_bytes(), b"short"]);
    assert!(matches!(
        parse(&raw).unwrap_err(),
        DecodeError::Truncated { unique: 14, .. }
    ));

    let mut raw = request(
        opcode::GETATTR,
        15,
        1,
        &[abi::GetattrIn::default().as_bytes()],
    );
    raw[36..38].copy_from_slice(&100u16.to_le_bytes()); // extension longer than the body
    assert!(matches!(
        parse(&raw).unwrap_err(),
        DecodeError::Truncated { unique: 15, .. }
    ));

    let head = abi::BatchForgetIn {
        count: 1000,
        dummy: 0,
    };
    let raw = request(opcode::BATCH_FORGET, 16, 0, &[head.as_bytes()]);
    assert!(matches!(
        parse(&raw).unwrap_err(),
        DecodeError::Truncated { .. }
    ));
}

#[test]
fn every_prefix_of_a_valid_request_decodes_or_errors_without_panicking() {
    let arg = abi::Rename2In {
        newdir: NodeId::new(5),
        flags: RenameFlags::empty(),
        padding: 0,
    };
    let raw = request(
        opcode::RENAME2,
        1,
        2,
        &[arg.as_bytes(), b"alpha\0", b"beta\0"],
    );
    for len in 0..raw.len() {
        let mut prefix = raw[..len].to_vec();
        if len >= 4 {
            prefix[..4].copy_from_slice(&(len as u32).to_le_bytes());
        }
        assert!(parse(&prefix).is_err(), "prefix of {len} bytes decoded");
    }
}

/// Collects every message written.
#[derive(Default)]
struct Capture(Mutex<Vec<Vec<u8>>>);

impl ReplyChannel for Capture {
    fn send(&self, message: &[IoSlice<'_>]) -> std::io::Result<()> {
        let bytes = message.iter().flat_map(|s| s.iter().copied()).collect();
        self.0.lock().expect("capture").push(bytes);
        Ok(())
    }
}

impl Capture {
    fn take(&self) -> Vec<u8> {
        self.0.lock().expect("capture").pop().expect("one message")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|row| {
            row.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sample_attr() -> abi::Attr {
    abi::Attr {
        ino: 2,
        size: 17,
        blocks: 1,
        mtime: 1_700_000_000,
        mtimensec: 5,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        blksize: 4096,
        ..Default::default()
    }
}

#[test]
fn reply_bytes_are_pinned() {
    let capture = Arc::new(Capture::default());
    let channel: Arc<dyn ReplyChannel> = capture.clone();

    let entry = abi::EntryOut {
        nodeid: NodeId::new(2),
        generation: 1,
        entry_valid: 1,
        attr_valid: 1,
        attr: sample_attr(),
        ..Default::default()
    };
    ReplyEntry::new(channel.clone(), 0x10).entry(&entry);
    insta::assert_snapshot!("entry_reply", hex(&capture.take()));

    ReplyAttr::new(channel.clone(), 0x11).error(Errno::ENOENT);
    insta::assert_snapshot!("error_reply", hex(&capture.take()));

    ReplyWrite::new(channel.clone(), 0x8000000000000012).written(4096);
    insta::assert_snapshot!("write_reply_to_resent_unique", hex(&capture.take()));

    ReplyCreate::new(channel.clone(), 0x13).created(
        &entry,
        FileHandle::new(7),
        FopenFlags::DIRECT_IO,
    );
    insta::assert_snapshot!("create_reply", hex(&capture.take()));

    let mut dir = DirentBuf::new_plus(4096);
    assert!(dir.push(
        DirentRecord {
            ino: 1,
            offset_next: 1,
            typ: 4,
            name: b"."
        },
        None
    ));
    assert!(dir.push(
        DirentRecord {
            ino: 2,
            offset_next: 2,
            typ: 8,
            name: b"hello"
        },
        Some(&entry)
    ));
    ReplyData::new(channel.clone(), 0x14).data(dir.as_bytes());
    insta::assert_snapshot!("readdirplus_reply", hex(&capture.take()));

    ReplyAttr::for_statx(channel.clone(), 0x15).attr(&abi::AttrOut {
        attr_valid: 1,
        attr: sample_attr(),
        ..Default::default()
    });
    let statx = capture.take();
    assert_eq!(statx.len(), 16 + std::mem::size_of::<abi::StatxOut>());
    insta::assert_snapshot!("statx_reply_from_getattr", hex(&statx));

    ReplyData::new(channel, 0x16).abandon();
    assert!(
        capture.0.lock().expect("capture").is_empty(),
        "an abandoned reply writes nothing"
    );
}

#[test]
fn readdir_buffer_stops_at_the_kernel_size() {
    let mut dir = DirentBuf::new(64);
    assert!(dir.push(
        DirentRecord {
            ino: 5,
            offset_next: 1,
            typ: 8,
            name: b"abcdefgh"
        },
        None
    )); // 24+8 = 32
    assert!(dir.push(
        DirentRecord {
            ino: 6,
            offset_next: 2,
            typ: 8,
            name: b"x"
        },
        None
    )); // 24+1 -> 32
    assert!(
        !dir.push(
            DirentRecord {
                ino: 7,
                offset_next: 3,
                typ: 8,
                name: b"y"
            },
            None
        ),
        "over 64 bytes"
    );
    assert_eq!(dir.as_bytes().len(), 64);
}

#[test]
fn init_grants_what_was_asked_and_offered_and_never_a_timeout() {
    let offer = abi::InitIn {
        major: 7,
        minor: 45,
        max_readahead: 131072,
        flags: 0x73fffffb,
        flags2: 0x5fd,
        ..Default::default()
    };
    let mut config = InitConfig::baton();
    config.flags |= abi::init_flags::REQUEST_TIMEOUT;
    let (params, out) = fuse_wire::negotiate(&offer, &config).expect("negotiate");
    assert!(params.has(abi::init_flags::HAS_RESEND));
    assert!(params.has(abi::init_flags::WRITEBACK_CACHE));
    assert!(
        !params.has(abi::init_flags::REQUEST_TIMEOUT),
        "a kernel timeout would abort the mount during a handover"
    );
    assert_eq!(
        (params.max_write, params.max_pages, out.max_pages),
        (1 << 20, 256, 256)
    );
    assert_eq!(
        u64::from(out.flags) | (u64::from(out.flags2) << 32),
        params.flags
    );
    assert_eq!((out.major, out.minor, params.minor), (7, 45, 45));

    let old = abi::InitIn {
        major: 7,
        minor: 31,
        max_readahead: 131072,
        flags: 0x1 | 0x20,
        ..Default::default()
    };
    let (params, _) = fuse_wire::negotiate(&old, &config).expect("negotiate old kernel");
    assert_eq!(params.minor, 31);
    assert!(
        !params.has(abi::init_flags::HAS_RESEND),
        "flags2 ignored without INIT_EXT"
    );
    assert_eq!(
        params.max_write,
        32 * 4096,
        "without MAX_PAGES the kernel caps requests at 32 pages"
    );

    let wrong = abi::InitIn { major: 8, ..offer };
    assert!(fuse_wire::negotiate(&wrong, &config).is_err());
}

#[test]
fn notifications_have_unique_zero_and_the_code_in_error() {
    let resend = fuse_wire::notify::encode(abi::notify_code::RESEND, &[]);
    assert_eq!(resend, [16, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let capture = Arc::new(Capture::default());
    fuse_wire::notify::inval_entry(&*capture, NodeId::ROOT, b"name", false).expect("send");
    let msg = capture.take();
    assert_eq!(msg.len(), 16 + 16 + 5);
    assert_eq!(&msg[4..8], &(abi::notify_code::INVAL_ENTRY).to_le_bytes());
    assert_eq!(&msg[32..], b"name\0");
}

/// A filesystem that answers LOOKUP with ENOENT and nothing else.
struct Empty;

impl fuse_wire::Filesystem for Empty {
    fn lookup(&self, _req: &Request<'_>, _parent: NodeId, _name: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::ENOENT);
    }
    fn getattr(
        &self,
        _req: &Request<'_>,
        _nodeid: NodeId,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::ENOENT);
    }
    fn readdir(
        &self,
        _req: &Request<'_>,
        _nodeid: NodeId,
        _arg: &abi::ReadIn,
        _entries: DirentBuf,
        reply: ReplyData,
    ) {
        reply.error(Errno::ENOTDIR);
    }
}

fn error_of(message: &[u8]) -> (i32, u64) {
    let header = <abi::OutHeader as zerocopy::FromBytes>::read_from_prefix(message)
        .expect("out header")
        .0;
    (header.error, header.unique)
}

#[test]
fn served_malformed_requests_get_einval_and_unknown_ones_never_enosys() {
    let capture = Arc::new(Capture::default());
    let channel: Arc<dyn ReplyChannel> = capture.clone();
    let options = DecodeOptions::default();

    let raw = request(opcode::LOOKUP, 21, 1, &[b"unterminated"]);
    fuse_wire::handle_request(&Empty, &channel, options, &raw);
    assert_eq!(error_of(&capture.take()), (-libc::EINVAL, 21));

    let raw = request(opcode::FORGET, 22, 1, &[&[1u8; 3]]);
    fuse_wire::handle_request(&Empty, &channel, options, &raw);
    assert!(
        capture.0.lock().expect("capture").is_empty(),
        "FORGET never gets a reply, even when malformed"
    );

    fuse_wire::handle_request(&Empty, &channel, options, &[1, 2, 3]);
    assert!(
        capture.0.lock().expect("capture").is_empty(),
        "no unique, nothing to answer"
    );

    for (op, body) in [
        (4000u32, Vec::new()),
        (opcode::IOCTL, abi::IoctlIn::default().as_bytes().to_vec()),
        (opcode::BMAP, abi::BmapIn::default().as_bytes().to_vec()),
        (
            opcode::FALLOCATE,
            abi::FallocateIn::default().as_bytes().to_vec(),
        ),
    ] {
        let raw = request(op, 23, 1, &[&body]);
        fuse_wire::handle_request(&Empty, &channel, options, &raw);
        let (error, unique) = error_of(&capture.take());
        assert_eq!(unique, 23);
        assert!(
            error < 0 && error != -libc::ENOSYS,
            "opcode {op} answered {error}"
        );
    }

    let poll = abi::PollIn {
        events: libc::POLLIN as u32,
        ..Default::default()
    };
    fuse_wire::handle_request(
        &Empty,
        &channel,
        options,
        &request(opcode::POLL, 24, 1, &[poll.as_bytes()]),
    );
    let message = capture.take();
    assert_eq!(
        error_of(&message),
        (0, 24),
        "POLL is answered like a regular file, never ENOSYS"
    );
}
