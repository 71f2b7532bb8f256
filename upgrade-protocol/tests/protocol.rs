//! The control message format is pinned, newer versions are refused, and fds
//! cross a socketpair close-on-exec.

use std::os::fd::{AsFd, AsRawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use upgrade_protocol::{
    decode, decode_record, encode, encode_record, recv_message, send_message, ClientOptions,
    ErrorKind, GenerationCounters, Message, MountRecord, MountStatus, NegotiatedInit,
    OpcodeCounters, ProtocolError, Recovery, Reply, Request, Restarts, StatusReport, Unanswered,
    UpgradeReport, LATENCY_BOUNDS_US, RECORD_FORMAT_VERSION,
};

/// Both ends of a SOCK_SEQPACKET socketpair, as between the supervisor and
/// a generation.
fn seqpacket_pair() -> nix::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

fn init() -> NegotiatedInit {
    NegotiatedInit {
        major: 7,
        minor: 45,
        kernel_minor: 45,
        flags: 0x8040640031,
        max_readahead: 131072,
        max_write: 1 << 20,
        max_pages: 256,
        max_background: 64,
        congestion_threshold: 48,
        time_gran: 1,
    }
}

#[test]
fn adopt_frame_is_pinned() {
    let frame = encode(&Message::Adopt {
        generation: 3,
        connection_identity: 0xfeed,
        init: init(),
        unanswered: Unanswered::Resend,
        handover: None,
    })
    .unwrap();
    let header: Vec<String> = frame[..12].iter().map(|b| format!("{b:02x}")).collect();
    insta::assert_snapshot!(
        "adopt_frame_v1",
        format!(
            "{}\n{}",
            header.join(" "),
            String::from_utf8_lossy(&frame[12..])
        )
    );
    assert_eq!(&frame[..4], b"BATN");
    assert_eq!(
        decode(&frame).unwrap(),
        Message::Adopt {
            generation: 3,
            connection_identity: 0xfeed,
            init: init(),
            unanswered: Unanswered::Resend,
            handover: None,
        }
    );
}

#[test]
fn an_adopt_from_a_holder_predating_connection_and_handover_still_decodes() {
    let old = br#"{"kind":"adopt","generation":3,"init":{"major":7,"minor":45,"kernel_minor":45,"flags":1,"max_readahead":1,"max_write":1,"max_pages":1,"max_background":1,"congestion_threshold":1,"time_gran":1},"resend":true}"#;
    let mut frame = b"BATN\x01\x00\x00\x00".to_vec();
    frame.truncate(4);
    frame.extend_from_slice(&1u16.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&(old.len() as u32).to_le_bytes());
    frame.extend_from_slice(old);
    let Message::Adopt {
        connection_identity,
        handover,
        ..
    } = decode(&frame).unwrap()
    else {
        panic!("not an adopt");
    };
    assert_eq!((connection_identity, handover), (0, None));
}

#[test]
fn newer_version_truncation_and_garbage_are_refused_clearly() {
    let mut frame = encode(&Message::Serving {
        generation: 1,
        pid: 9,
        reading_ns: 0,
    })
    .unwrap();
    frame[4] = 2;
    let err = decode(&frame).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::UnsupportedVersion {
                found: 2,
                supported: 1
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("newer than this binary"));

    let frame = encode(&Message::Serving {
        generation: 1,
        pid: 9,
        reading_ns: 0,
    })
    .unwrap();
    assert!(matches!(
        decode(&frame[..frame.len() - 3]),
        Err(ProtocolError::Truncated { .. })
    ));
    assert!(matches!(
        decode(b"GET / HTTP/1.1\r\n"),
        Err(ProtocolError::BadMagic)
    ));
    let mut corrupt = frame.clone();
    let last = corrupt.len() - 1;
    corrupt[last] = b'!';
    assert!(matches!(decode(&corrupt), Err(ProtocolError::Body(_))));
}

#[test]
fn fds_arrive_close_on_exec_and_counts_are_checked() {
    let (a, b) = seqpacket_pair().unwrap();
    let file = tempfile::tempfile().unwrap();
    let message = Message::Adopt {
        generation: 2,
        connection_identity: 1,
        init: init(),
        unanswered: Unanswered::Leave,
        handover: None,
    };
    send_message(a.as_fd(), &message, &[file.as_fd()]).unwrap();
    let (got, fds) = recv_message(b.as_fd()).unwrap();
    assert_eq!(got, message);
    assert_eq!(fds.len(), 1);
    let flags = FdFlag::from_bits_truncate(fcntl(fds[0].as_fd(), FcntlArg::F_GETFD).unwrap());
    assert!(
        flags.contains(FdFlag::FD_CLOEXEC),
        "received fd {} would leak into children",
        fds[0].as_raw_fd()
    );

    let err = send_message(a.as_fd(), &message, &[]).unwrap_err();
    assert!(matches!(
        err,
        ProtocolError::FdCount {
            expected: 1,
            found: 0,
            ..
        }
    ));
    drop(a);
    assert!(matches!(
        recv_message(b.as_fd()),
        Err(ProtocolError::Closed)
    ));
}

fn record() -> MountRecord {
    MountRecord {
        format_version: RECORD_FORMAT_VERSION,
        mount_id: "0123456789abcdef".into(),
        mountpoint: "/mnt/baton".into(),
        volume: "vol1".into(),
        base_dir: "/var/lib/baton".into(),
        options: ClientOptions::default(),
        connection_id: 43,
        connection_identity: 0xfeed,
        client_binary: Some("/usr/local/bin/fsclient".into()),
        init: init(),
        has_resend: true,
        supervisor_pid: 1,
        generation: 3,
        pid: Some(99),
        created_unix_ms: 5,
        persistent: false,
        history: None,
    }
}

fn mount_request() -> Message {
    Message::Control {
        request: Request::Mount {
            volume: "vol1".into(),
            mountpoint: "/mnt/baton".into(),
            base_dir: "/var/lib/baton".into(),
            options: ClientOptions {
                cache_dir: None,
                staging_dir: Some("/var/lib/baton/staging".into()),
                threads: Some(4),
                cache_size_bytes: None,
            },
            persist: false,
        },
    }
}

#[test]
fn control_frames_are_pinned_and_round_trip() {
    let status = StatusReport {
        supervisor: Some(upgrade_protocol::SupervisorInfo {
            pid: 77,
            binary: "/usr/local/bin/fs-supervisor".into(),
            version: "0.1.0".into(),
            started_unix_ms: 1_795_000_000_000,
            fd_store: false,
            start_notes: Vec::new(),
        }),
        mounts: vec![MountStatus {
            persistent: false,
            mount_id: "0123456789abcdef".into(),
            mountpoint: "/mnt/baton".into(),
            volume: "vol1".into(),
            state: "serving".into(),
            generation: 2,
            pid: Some(4242),
            standby_pid: Some(4343),
            restarts: Restarts {
                exit: 0,
                signal: 1,
                oom: 0,
            },
            uptime_s: 12,
            generation_uptime_s: 3,
            consecutive_failures: 0,
            gave_up: false,
            read_only_reason: None,
            last_recovery: Some(Recovery {
                died_generation: 1,
                cause: "signal 9 (SIGKILL)".into(),
                at_unix_ms: 1_700_000_000_000,
                next_generation: Some(2),
                takeover_us: Some(812),
                warm: true,
            }),
            last_upgrade: Some(UpgradeReport {
                mountpoint: "/mnt/a".into(),
                ok: true,
                outcome: "upgraded".into(),
                from_generation: 1,
                serving_died: false,
                generation: 3,
                binary: "/usr/local/bin/fsclient".into(),
                journaled: 0,
                stall_us: Some(812),
                elapsed_ms: 54,
                at_unix_ms: 1_795_000_000_000,
                detail: None,
            }),
            client_binary: "/usr/local/bin/fsclient".into(),
            requests_recovered: 2,
            connection_id: 43,
            counters: None,
            incidents: Vec::new(),
            cgroup: Some("/sys/fs/cgroup/memory/baton/0123456789abcdef-gen2".into()),
            init: init(),
        }],
    };
    let messages = [
        ("control_mount_v1", mount_request()),
        (
            "control_status_v1",
            Message::Control {
                request: Request::Status,
            },
        ),
        (
            "control_umount_v1",
            Message::Control {
                request: Request::Umount {
                    mountpoint: "/mnt/baton".into(),
                },
            },
        ),
        (
            "reply_mounted_v1",
            Message::ControlReply {
                reply: Reply::Mounted {
                    mountpoint: "/mnt/baton".into(),
                    generation: 1,
                    pid: 4242,
                },
            },
        ),
        (
            "reply_status_v1",
            Message::ControlReply {
                reply: Reply::Status { report: status },
            },
        ),
        (
            "reply_unmounted_v1",
            Message::ControlReply {
                reply: Reply::Unmounted {
                    mountpoint: "/mnt/baton".into(),
                    warning: None,
                },
            },
        ),
        (
            "reply_error_v1",
            Message::ControlReply {
                reply: Reply::Error {
                    kind: ErrorKind::PermissionDenied,
                    message: "refused".into(),
                },
            },
        ),
    ];
    for (name, message) in messages {
        let frame = encode(&message).unwrap();
        let header: Vec<String> = frame[..12].iter().map(|b| format!("{b:02x}")).collect();
        insta::assert_snapshot!(
            name,
            format!(
                "{}\n{}",
                header.join(" "),
                String::from_utf8_lossy(&frame[12..])
            )
        );
        assert_eq!(decode(&frame).unwrap(), message);
        assert_eq!(message.fd_count(), 0);
    }
}

#[test]
fn control_messages_cross_a_socketpair_without_fds() {
    let (a, b) = seqpacket_pair().unwrap();
    send_message(a.as_fd(), &mount_request(), &[]).unwrap();
    let (got, fds) = recv_message(b.as_fd()).unwrap();
    assert_eq!(got, mount_request());
    assert!(fds.is_empty());
}

#[test]
fn messages_of_any_size_arrive_whole_and_in_order_then_closed() {
    // recv_message sizes its buffer from the next message's length (a
    // MSG_PEEK): a large message after a small one and a small one after a
    // large one must each arrive whole.
    let (a, b) = seqpacket_pair().unwrap();
    let large = Message::Control {
        request: Request::Mount {
            volume: "vol1".into(),
            mountpoint: format!("/mnt/{}", "m".repeat(100_000)).into(),
            base_dir: "/var/lib/baton".into(),
            options: ClientOptions {
                cache_dir: None,
                staging_dir: None,
                threads: None,
                cache_size_bytes: None,
            },
            persist: true,
        },
    };
    let sent = [mount_request(), large, mount_request()];
    for message in &sent {
        send_message(a.as_fd(), message, &[]).unwrap();
    }
    drop(a);
    for message in &sent {
        let (got, fds) = recv_message(b.as_fd()).unwrap();
        assert_eq!(&got, message);
        assert!(fds.is_empty());
    }
    let closed = recv_message(b.as_fd()).unwrap_err();
    assert!(matches!(closed, ProtocolError::Closed), "{closed}");
}

#[test]
fn state_record_round_trips_and_newer_formats_are_refused() {
    let record = record();
    let bytes = encode_record(&record).unwrap();
    assert_eq!(decode_record(&bytes).unwrap(), record);
    let newer = String::from_utf8(bytes)
        .unwrap()
        .replace("\"format_version\": 1", "\"format_version\": 2");
    let err = decode_record(newer.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::UnsupportedVersion {
                found: 2,
                supported: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn a_mount_passed_to_a_successor_crosses_with_its_fd_and_the_frames_are_pinned() {
    let record = MountRecord {
        client_binary: None,
        pid: None,
        persistent: true,
        ..record()
    };
    let (a, b) = seqpacket_pair().unwrap();
    let file = tempfile::tempfile().unwrap();
    let pass = Message::PassMount {
        record: record.clone(),
    };
    // The fd is the mount: a pass without it is refused before sending.
    assert!(matches!(
        send_message(a.as_fd(), &pass, &[]),
        Err(ProtocolError::FdCount { expected: 1, .. })
    ));
    send_message(a.as_fd(), &pass, &[file.as_fd()]).unwrap();
    let (got, fds) = recv_message(b.as_fd()).unwrap();
    assert_eq!(got, pass);
    assert_eq!(fds.len(), 1);

    // The three fd-less steps, pinned as they cross between two builds.
    for (message, json) in [
        (Message::PassDone, r#"{"kind":"pass_done"}"#),
        (
            Message::PassReceived {
                mounts: vec!["0123456789abcdef".into()],
            },
            r#"{"kind":"pass_received","mounts":["0123456789abcdef"]}"#,
        ),
        (Message::Released, r#"{"kind":"released"}"#),
    ] {
        let frame = encode(&message).unwrap();
        assert_eq!(String::from_utf8_lossy(&frame[12..]), json);
        assert_eq!(decode(&frame).unwrap(), message);
    }
}

#[test]
fn stats_counters_are_optional_both_ways() {
    // A generation that predates the counters: its report still decodes.
    let old = br#"{"kind":"stats","generation":3,"requests_recovered":1}"#;
    let mut frame = Vec::from(*b"BATN");
    frame.extend_from_slice(&1u16.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&(old.len() as u32).to_le_bytes());
    frame.extend_from_slice(old);
    assert_eq!(
        decode(&frame).unwrap(),
        Message::Stats {
            generation: 3,
            requests_recovered: 1,
            counters: None
        }
    );
    // Without counters the frame is byte-for-byte the old one.
    let encoded = encode(&Message::Stats {
        generation: 3,
        requests_recovered: 1,
        counters: None,
    })
    .unwrap();
    assert_eq!(encoded, frame);
    // With counters: round trip; an older reader's shape (the same enum
    // without the field) ignores them.
    let counters = GenerationCounters {
        latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
        requests: vec![OpcodeCounters {
            opcode: 16,
            count: 2,
            latency_us_sum: 300,
            latency_buckets: vec![0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        }],
        written_bytes: 8192,
        ..GenerationCounters::default()
    };
    let new = Message::Stats {
        generation: 4,
        requests_recovered: 0,
        counters: Some(Box::new(counters)),
    };
    let frame = encode(&new).unwrap();
    assert_eq!(decode(&frame).unwrap(), new);
    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum OldMessage {
        Stats {
            generation: u64,
            requests_recovered: u64,
        },
    }
    let old: OldMessage = serde_json::from_slice(&frame[12..]).unwrap();
    assert_eq!(
        old,
        OldMessage::Stats {
            generation: 4,
            requests_recovered: 0
        }
    );
}

#[test]
fn mount_counters_add_generations_and_keep_histograms_apart_when_bounds_differ() {
    let one = |opcode, count, bucket: usize| GenerationCounters {
        latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
        requests: vec![OpcodeCounters {
            opcode,
            count,
            latency_us_sum: count * 10,
            latency_buckets: (0..=LATENCY_BOUNDS_US.len())
                .map(|i| if i == bucket { count } else { 0 })
                .collect(),
        }],
        read_bytes: count,
        uploads_pending: 5,
        ..GenerationCounters::default()
    };
    let mut total = GenerationCounters::default();
    total.add(&one(16, 2, 0));
    total.add(&one(15, 3, 1));
    total.add(&one(16, 1, 12));
    assert_eq!(
        total.requests.iter().map(|o| o.opcode).collect::<Vec<_>>(),
        [15, 16]
    );
    assert_eq!(total.requests[1].count, 3);
    assert_eq!(total.requests[1].latency_buckets[0], 2);
    assert_eq!(total.requests[1].latency_buckets[12], 1);
    assert_eq!(total.read_bytes, 6);
    assert_eq!(total.uploads_pending, 0, "a gauge is not summed");
    let mut other_bounds = one(16, 4, 0);
    other_bounds.latency_bounds_us = vec![1, 2];
    total.add(&other_bounds);
    assert_eq!(total.requests[1].count, 7);
    assert_eq!(
        total.requests[1].latency_buckets.iter().sum::<u64>(),
        3,
        "buckets of other bounds are not mixed in"
    );
}
