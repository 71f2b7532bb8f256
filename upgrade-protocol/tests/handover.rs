//! The planned-upgrade formats: the handover state and the in-flight
//! journal are pinned by snapshots, round-trip, and every damage a file can
//! suffer (truncation, a flipped byte, a newer major version, a foreign
//! file) is refused with a clear error instead of being half-loaded.
#![allow(clippy::unwrap_used)]

use upgrade_protocol::{
    decode_state, encode_state, HandleState, HandoverState, InflightJournal, NegotiatedInit,
    ProtocolError,
};

fn state() -> HandoverState {
    HandoverState {
        generation: 4,
        connection_identity: 0xfeed,
        init: NegotiatedInit {
            major: 7,
            minor: 45,
            kernel_minor: 45,
            flags: 0x1_0000_0001,
            max_readahead: 131072,
            max_write: 1 << 20,
            max_pages: 256,
            max_background: 64,
            congestion_threshold: 48,
            time_gran: 1,
        },
        handles: vec![HandleState {
            fh: (4 << 40) + 3,
            ino: 12,
            flags: 2,
            dir: false,
        }],
        next_fh: (4 << 40) + 4,
        open_orphans: vec![12],
        locks: Vec::new(),
        journal: Some("/var/lib/baton/supervisor/run/journal-x".into()),
        journaled: 1,
        stopped_reading_ns: 5,
    }
}

#[test]
fn state_is_pinned_and_round_trips() {
    let bytes = encode_state(&state()).unwrap();
    let header: Vec<String> = bytes[..16].iter().map(|b| format!("{b:02x}")).collect();
    insta::assert_snapshot!(
        "handover_state_v1_0",
        format!(
            "{}\n{}",
            header.join(" "),
            String::from_utf8_lossy(&bytes[16..])
        )
    );
    assert_eq!(decode_state(&bytes).unwrap(), state());
}

#[test]
fn damaged_state_is_refused_clearly() {
    let bytes = encode_state(&state()).unwrap();
    for len in [0, 10, 16, bytes.len() - 1] {
        let err = decode_state(&bytes[..len]).unwrap_err();
        assert!(matches!(err, ProtocolError::Corrupt { .. }), "{len}: {err}");
        assert!(err.to_string().contains("rolls back"), "{err}");
    }
    let mut flipped = bytes.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x20;
    assert!(matches!(
        decode_state(&flipped),
        Err(ProtocolError::Corrupt {
            reason: "checksum mismatch",
            ..
        })
    ));
    let mut newer = bytes.clone();
    newer[4] = 2;
    assert!(matches!(
        decode_state(&newer),
        Err(ProtocolError::UnsupportedVersion {
            found: 2,
            supported: 1
        })
    ));
    // A newer minor is read: minors only add fields.
    let mut minor = bytes.clone();
    minor[6] = 9;
    assert_eq!(decode_state(&minor).unwrap(), state());
    assert!(matches!(
        decode_state(b"BATN\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
        Err(ProtocolError::Corrupt { .. })
    ));
}

#[test]
fn journal_is_pinned_round_trips_and_refuses_damage() {
    let journal = InflightJournal {
        requests: vec![b"first request".to_vec(), Vec::new(), vec![0xff; 3]],
    };
    let bytes = journal.encode().unwrap();
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    insta::assert_snapshot!("inflight_journal_v1", hex.join(" "));
    assert_eq!(InflightJournal::decode(&bytes).unwrap(), journal);
    for len in 0..bytes.len() {
        assert!(
            InflightJournal::decode(&bytes[..len]).is_err(),
            "a journal cut at {len} bytes was accepted"
        );
    }
    let mut flipped = bytes.clone();
    flipped[20] ^= 1;
    assert!(matches!(
        InflightJournal::decode(&flipped),
        Err(ProtocolError::Corrupt { .. })
    ));
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(InflightJournal::decode(&trailing).is_err());
    let mut newer = bytes;
    newer[4] = 2;
    assert!(matches!(
        InflightJournal::decode(&newer),
        Err(ProtocolError::UnsupportedVersion { .. })
    ));
}

/// The state format 1.0 as written by the first build that had it. Every
/// later build must still load it (a new binary takes over from an old
/// one): if this test fails, bump the major version instead.
#[test]
fn the_first_state_format_still_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/handover-state-v1.0.bin"
    );
    if std::env::var_os("BATON_WRITE_FIXTURES").is_some() {
        std::fs::write(path, encode_state(&state()).unwrap()).unwrap();
    }
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[4..8], &[1, 0, 0, 0], "the fixture is format 1.0");
    assert_eq!(decode_state(&bytes).unwrap(), state());
}

#[test]
fn held_locks_round_trip_and_damage_is_refused() {
    let held = upgrade_protocol::HeldLocks {
        connection_identity: 0xfeed,
        locks: vec![upgrade_protocol::LockState {
            ino: 9,
            owner: 77,
            start: 0,
            end: u64::MAX,
            kind: 1, // F_WRLCK
            pid: 1234,
            flock: true,
        }],
    };
    let bytes = held.encode().unwrap();
    assert_eq!(&bytes[..4], b"BATL");
    assert_eq!(upgrade_protocol::HeldLocks::decode(&bytes).unwrap(), held);
    // A flipped body byte, a cut file and a handover state are all refused.
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert!(upgrade_protocol::HeldLocks::decode(&flipped).is_err());
    assert!(upgrade_protocol::HeldLocks::decode(&bytes[..bytes.len() - 1]).is_err());
    let mut newer = bytes.clone();
    newer[4] = 2;
    assert!(matches!(
        upgrade_protocol::HeldLocks::decode(&newer),
        Err(upgrade_protocol::ProtocolError::UnsupportedVersion { found: 2, .. })
    ));
}
