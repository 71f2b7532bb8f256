//! The HTTP side of `--metrics-listen`: hyper 1 (HTTP/1.1 and 1.0,
//! keep-alive) on a current-thread tokio runtime in its own thread, one
//! task per connection, so an idle or slow client never delays another's
//! scrape. At most [`CONNECTIONS_MAX`] connections are served at once (the
//! next one is answered 503 and closed); a client has
//! [`REQUEST_TIMEOUT_MS`] to send each request's headers, at most
//! [`REQUEST_BYTES_MAX`] of them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use super::{not_ready, read_memory, render, render_page_with_charts, unix_ms_now, Snapshot};

/// Request header bytes read at most (hyper's smallest buffer limit).
pub const REQUEST_BYTES_MAX: usize = 8192;
/// How long a client may take to send a request's headers (an idle
/// keep-alive connection is closed after it too).
pub const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Connections served at once; one more is answered 503 and closed.
pub const CONNECTIONS_MAX: usize = 64;
/// Pause after a failed accept (out of fds): the loop must not spin.
const ACCEPT_RETRY_MS: u64 = 50;

const BUSY_BODY: &str = "too many open connections to fs-supervisor's metrics: retry\n";

/// The whole answer to a connection past [`CONNECTIONS_MAX`].
fn busy_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BUSY_BODY}",
        BUSY_BODY.len()
    )
}

/// Binds `addr` and answers in a thread of its own. Any address is
/// allowed; one that is not loopback is logged as a warning, because the
/// page and the labels name mount paths, volumes and pids.
pub fn serve(addr: SocketAddr, snapshot: Snapshot) -> std::io::Result<SocketAddr> {
    serve_with(addr, snapshot, Duration::from_millis(REQUEST_TIMEOUT_MS))
}

/// [`serve`] with another header timeout (tests).
pub(super) fn serve_with(
    addr: SocketAddr,
    snapshot: Snapshot,
    request_timeout: Duration,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    if local.ip().is_loopback() {
        tracing::info!(addr = %local, "metrics and status page");
    } else {
        tracing::warn!(
            addr = %local,
            "metrics and status page on a non-loopback address: anyone who reaches it sees \
             mount paths, volume names and pids; restrict it with a firewall or NetworkPolicy, \
             or use --metrics-listen 127.0.0.1:PORT"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept_loop(listener, snapshot, request_timeout)))?;
    Ok(local)
}

async fn accept_loop(
    listener: std::net::TcpListener,
    snapshot: Snapshot,
    request_timeout: Duration,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(%err, "metrics: cannot watch the listening socket; no metrics will be served");
            return;
        }
    };
    let open = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let busy = busy_response();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                tracing::debug!(%err, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            // A fresh socket's send buffer takes this whole; if not, the
            // client just sees the connection closed.
            let _ = stream.try_write(busy.as_bytes());
            continue;
        };
        let snapshot = snapshot.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&request, &snapshot);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(request_timeout)
                .max_buf_size(REQUEST_BYTES_MAX)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(err) = connection.await {
                tracing::debug!(%err, "metrics connection ended with an error");
            }
            drop(permit);
        });
    }
}

fn respond(request: &Request<Incoming>, snapshot: &Snapshot) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET and HEAD\n".into(),
        );
    }
    let (mounts, totals) = snapshot.read();
    let uptime_s = snapshot.started.elapsed().as_secs();
    match request.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            render(
                &mounts,
                &mounts.iter().map(read_memory).collect::<Vec<_>>(),
                &totals,
                uptime_s,
            ),
        ),
        "/" => reply(StatusCode::OK, "text/html; charset=utf-8", {
            let now_unix_ms = unix_ms_now();
            render_page_with_charts(
                &mounts,
                &snapshot.charts(now_unix_ms),
                &totals,
                uptime_s,
                now_unix_ms,
            )
        }),
        // The loop published a snapshot: the process answers.
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match not_ready(&mounts) {
            None => reply(StatusCode::OK, "text/plain", "ready\n".into()),
            Some(why) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /, /healthz or /readyz\n".into(),
        ),
    }
}

fn reply(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}
