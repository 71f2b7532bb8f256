//! kubelet before 1.26 dials a plugin's socket by its bare path, and its
//! grpc-go client then sends that path as the HTTP/2 `:authority`
//! (kubernetes/kubernetes#112597 set `localhost` in 1.26). h2, under
//! tonic, refuses such a request with PROTOCOL_ERROR ("malformed
//! authority"), so kubelet's GetInfo on the registration socket and every
//! CSI call failed. Each accepted connection therefore passes through a
//! relay: the client's header blocks are decoded (HPACK, with the client's
//! table), an `:authority` that is not a URI authority becomes `localhost`,
//! and the block is encoded again as literals that never touch the
//! server's table; every other frame, and everything the server sends, is
//! copied as is.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::http::uri::Authority;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's
/// initial value); re-encoded header blocks are cut to it.
const FRAME_PAYLOAD_MAX: usize = 16_384;
/// The largest frame the relay reads (the protocol's own limit, 2^24-1).
const FRAME_READ_MAX: usize = (1 << 24) - 1;
/// The largest header block the relay gathers before giving up on the
/// connection (CSI requests carry a few small headers).
const HEADER_BLOCK_MAX: usize = 1 << 20;
/// The in-process pipe between the relay and tonic.
const PIPE_BYTES: usize = 64 * 1024;
/// What a malformed `:authority` is replaced with (what grpc-go sends for
/// unix sockets since 1.26's kubelet).
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// Accepted connections, each behind the relay, for tonic's
/// `serve_with_incoming`.
pub fn incoming(listener: UnixListenerStream) -> impl Stream<Item = io::Result<DuplexStream>> {
    listener.map(|accepted| {
        accepted.map(|socket| {
            let (outer, inner) = tokio::io::duplex(PIPE_BYTES);
            tokio::spawn(relay(socket, outer));
            inner
        })
    })
}

async fn relay(socket: UnixStream, server: DuplexStream) {
    let (mut from_client, mut to_client) = socket.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let upstream = async {
        if let Err(err) = rewrite_client_frames(&mut from_client, &mut to_server).await {
            tracing::debug!(error = %err, "a client connection ended");
        }
        let _ = to_server.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Copies the client's side of an HTTP/2 connection from `from` to `to`,
/// re-encoding every header block (see the module's doc). Something that
/// is not HTTP/2 with prior knowledge is copied unchanged.
pub async fn rewrite_client_frames<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    let mut decoder = loona_hpack::Decoder::new();
    // A HEADERS frame waiting for its CONTINUATIONs: (flags, priority
    // bytes, the block so far).
    let mut pending: Option<(u8, Vec<u8>, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(err) => return Err(err),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        debug_assert!(len <= FRAME_READ_MAX);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let stream = [head[5], head[6], head[7], head[8]];
        match (kind, pending.take()) {
            (FRAME_HEADERS, None) => {
                let (priority, fragment) = split_headers_payload(flags, &payload)?;
                pending = Some((flags, priority.to_vec(), fragment.to_vec()));
            }
            (FRAME_CONTINUATION, Some((first_flags, priority, mut block))) => {
                block.extend_from_slice(&payload);
                pending = Some((first_flags | (flags & FLAG_END_HEADERS), priority, block));
            }
            (_, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a frame other than CONTINUATION inside a header block",
                ))
            }
            (_, None) => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        let Some((first_flags, priority, block)) = pending.take() else {
            continue;
        };
        if block.len() > HEADER_BLOCK_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a header block over {HEADER_BLOCK_MAX} bytes"),
            ));
        }
        if first_flags & FLAG_END_HEADERS == 0 {
            pending = Some((first_flags, priority, block));
            continue;
        }
        let headers = decoder
            .decode(&block)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {err:?}")))?;
        let encoded = encode_literals(&fix_authority(headers));
        write_header_frames(to, first_flags, &priority, &encoded, stream).await?;
    }
}

/// A HEADERS payload's priority fields and block fragment, padding removed.
fn split_headers_payload(flags: u8, payload: &[u8]) -> io::Result<(&[u8], &[u8])> {
    let invalid = || io::Error::new(io::ErrorKind::InvalidData, "a malformed HEADERS frame");
    let mut body = payload;
    let mut pad = 0usize;
    if flags & FLAG_PADDED != 0 {
        let (&len, rest) = body.split_first().ok_or_else(invalid)?;
        pad = usize::from(len);
        body = rest;
    }
    let priority_len = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
    if body.len() < priority_len + pad {
        return Err(invalid());
    }
    let (priority, rest) = body.split_at(priority_len);
    Ok((priority, &rest[..rest.len() - pad]))
}

/// The headers with an `:authority` that is no URI authority replaced.
fn fix_authority(mut headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    for (name, value) in &mut headers {
        if name.as_slice() == b":authority" && Authority::try_from(value.as_slice()).is_err() {
            *value = LOCAL_AUTHORITY.to_vec();
        }
    }
    headers
}

/// HPACK integer with an `prefix_bits`-bit prefix, `first` holding the
/// bits above it (RFC 7541, 5.1).
fn put_integer(out: &mut Vec<u8>, first: u8, prefix_bits: u32, value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Every header as "literal without indexing, new name", no Huffman: the
/// server's dynamic table is never used, so it stays what the relay's
/// output implies whatever the client's encoder did.
fn encode_literals(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        put_integer(&mut out, 0x00, 7, name.len());
        out.extend_from_slice(name);
        put_integer(&mut out, 0x00, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

async fn write_header_frames<W: AsyncWrite + Unpin>(
    to: &mut W,
    flags: u8,
    priority: &[u8],
    block: &[u8],
    stream: [u8; 4],
) -> io::Result<()> {
    let first_room = FRAME_PAYLOAD_MAX - priority.len();
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let mut first_flags = flags & (FLAG_END_STREAM | FLAG_PRIORITY);
    if rest.is_empty() {
        first_flags |= FLAG_END_HEADERS;
    }
    let mut payload = priority.to_vec();
    payload.extend_from_slice(first);
    write_frame(to, FRAME_HEADERS, first_flags, stream, &payload).await?;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(FRAME_PAYLOAD_MAX));
        let end = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame(to, FRAME_CONTINUATION, end, stream, chunk).await?;
        rest = tail;
    }
    Ok(())
}

async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    kind: u8,
    flags: u8,
    stream: [u8; 4],
    payload: &[u8],
) -> io::Result<()> {
    // Invariant: callers cut payloads to FRAME_PAYLOAD_MAX (< 2^24).
    assert!(payload.len() <= FRAME_PAYLOAD_MAX);
    let len = payload.len();
    let head = [
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        kind,
        flags,
        stream[0],
        stream[1],
        stream[2],
        stream[3],
    ];
    to.write_all(&head).await?;
    to.write_all(payload).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn frames(bytes: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            out.push((rest[3], rest[4], rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        out
    }

    /// What kubelet 1.20 sends: the socket path as authority, HPACK with
    /// the dynamic table (a second request refers to the first's entries),
    /// the second block split over a CONTINUATION.
    #[tokio::test]
    async fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let request = |path: &'static [u8]| -> Vec<(&'static [u8], &'static [u8])> {
            vec![
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", path),
                (
                    b":authority",
                    b"/var/lib/kubelet/plugins_registry/csi.baton.dev-reg.sock",
                ),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
            ]
        };
        let mut encoder = loona_hpack::Encoder::new();
        let first = encoder.encode(request(b"/pluginregistration.Registration/GetInfo"));
        let second = encoder.encode(request(
            b"/pluginregistration.Registration/NotifyRegistrationStatus",
        ));
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &first));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0"));
        let (a, b) = second.split_at(second.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(frame(FRAME_HEADERS, FLAG_PADDED, 3, &padded));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 3, b));

        let mut output = Vec::new();
        rewrite_client_frames(&mut input.as_slice(), &mut output)
            .await
            .unwrap();
        assert_eq!(&output[..24], PREFACE);
        let out = frames(&output[24..]);
        assert_eq!(out.len(), 4, "SETTINGS, HEADERS, DATA, HEADERS");
        assert_eq!(
            (out[0].0, out[2].0, out[2].2.as_slice()),
            (0x4, 0x0, &b"\0\0\0\0\0"[..])
        );
        let mut server = loona_hpack::Decoder::new();
        for (index, path) in [(1, "GetInfo"), (3, "NotifyRegistrationStatus")] {
            let (kind, flags, block) = &out[index];
            assert_eq!((*kind, *flags), (FRAME_HEADERS, FLAG_END_HEADERS));
            let headers = server.decode(block).unwrap();
            let get = |name: &[u8]| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(get(b":authority").unwrap(), b"localhost");
            assert_eq!(
                get(b":path").unwrap(),
                format!("/pluginregistration.Registration/{path}").into_bytes()
            );
            assert_eq!(get(b"te").unwrap(), b"trailers");
            assert_eq!(headers.len(), 6);
        }
    }

    #[test]
    fn a_valid_authority_is_kept() {
        let headers = vec![(b":authority".to_vec(), b"localhost:50051".to_vec())];
        assert_eq!(fix_authority(headers.clone()), headers);
    }

    #[test]
    fn integers_use_the_prefix_then_continuation_bytes() {
        let mut out = Vec::new();
        put_integer(&mut out, 0, 7, 126);
        put_integer(&mut out, 0, 7, 127);
        put_integer(&mut out, 0, 7, 1337);
        assert_eq!(out, vec![126, 127, 0, 127, 0xba, 0x09]);
    }
}
