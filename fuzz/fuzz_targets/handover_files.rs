//! Files one process writes and another reads after a crash or an upgrade:
//! the handover state, the held locks, the in-flight journal and the
//! mount's state record. Any bytes (a torn write, another version, a
//! hostile file) decode or give a `ProtocolError`, never a panic.
//!
//! The first byte picks the decoder, and whether the rest is taken as the
//! whole file or as the body of a file with a valid header and checksum
//! (so that mutations reach the body's parser instead of stopping at the
//! checksum).
#![no_main]

use libfuzzer_sys::fuzz_target;
use upgrade_protocol::{decode_record, decode_state, HeldLocks, InflightJournal};

/// `magic | major | minor | len | crc32 | body`, as handover.rs frames its
/// files (major and minor 1: the versions the decoders read).
fn framed(magic: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = magic.to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// A journal with valid checksums whose entries are cut from `bytes` (each
/// entry's length is the byte before it).
fn journal_of(bytes: &[u8]) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut rest = bytes;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        entries.push(&tail[..len]);
        rest = &tail[len..];
    }
    let mut out = b"BATJ".to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in entries {
        out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(entry).to_le_bytes());
        out.extend_from_slice(entry);
    }
    out
}

fn journal(bytes: &[u8]) {
    if let Ok(journal) = InflightJournal::decode(bytes) {
        let again = journal.encode().expect("a decoded journal encodes");
        assert_eq!(InflightJournal::decode(&again).ok(), Some(journal));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 => drop(decode_state(bytes)),
        1 => drop(decode_state(&framed(b"BATS", bytes))),
        2 => drop(HeldLocks::decode(bytes)),
        3 => drop(HeldLocks::decode(&framed(b"BATL", bytes))),
        4 => journal(bytes),
        5 => journal(&journal_of(bytes)),
        _ => drop(decode_record(bytes)),
    }
});
