//! The HTTP/1.1 server under the router (hyper's connection builder; axum's
//! `serve` cannot bound how long a request head may take):
//!
//! - **Header-read timeout**: a client has `header_read_timeout` to send a
//!   whole request head, from its connect or, on a kept-alive connection,
//!   from the end of the previous response; then the connection is closed.
//! - **Head size**: a request head (request line and headers) larger than
//!   `max_head_size` is answered 431 and the connection closed as soon as
//!   that much is read: the read buffer never grows past it (hyper's own
//!   default lets an unfinished head hold ~400 KB for `header_read_timeout`).
//! - **Body read timeout**: a request's body must arrive within
//!   `body_read_timeout` of its head; a body still coming then ends in an
//!   error ([`BodyTimeout`], which the JSON extractor answers 408) and the
//!   connection is closed, so a client trickling a byte every few seconds
//!   (never idle, never done) holds its slot no longer.
//! - **Lingering close**: a connection the server closes is first half-closed,
//!   and what the client still sends is read and dropped until it closes too
//!   (at most 5 s and 1 MiB), so the client reads the last answer (a 431, a
//!   413 sent before the body was read) instead of losing it to a reset. A
//!   lingering connection has no request in progress: at the cap it is among
//!   the first closed to make room.
//! - **Idle timeout**: a connection on which no byte is read or written for
//!   `idle_timeout` is closed (a stalled upload, a client that stopped
//!   reading). Event streams send keep-alives well within it.
//! - **Connection cap**: at most `max_connections` at once, lowered to stay
//!   under the process's file-descriptor limit. At the cap a new connection
//!   is not left waiting in the kernel's backlog (that is where `/healthz`
//!   would sit behind a flood of idle sockets): the connection that has been
//!   idle longest (no request in progress: a slow or unfinished request head,
//!   or a kept-alive connection between requests) is closed to make room, as
//!   nginx reuses idle keep-alive connections. A request in progress (an
//!   event stream too) is never cut for it; with none idle, the new
//!   connection is closed at once. The cap is logged once when it is reached
//!   and once when the server is below it again, never per connection.
//! - **Accept errors** do not end the server or spin: out of file
//!   descriptors (taken by more than connections, or a limit lowered since
//!   the start), the longest-idle connection is closed to free one; any other
//!   error (or none idle) backs off, 10 ms doubling to 1 s. Logged once per
//!   episode.
//! - **Graceful shutdown**: accepting stops, every connection finishes the
//!   request it is on and closes (idle ones at once), then [`serve`] returns;
//!   [`Connections::close_all`] cuts what is left when the time is up.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arbor_actors::sync::LockExt as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use super::limits::ServiceLimits;

/// The open connections of one server, and its cap.
pub(crate) struct Connections {
    cap: usize,
    slots: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// Whether the cap is reached (logged once per episode), and what it
    /// cost meanwhile.
    at_cap: AtomicBool,
    evicted: AtomicU64,
    refused: AtomicU64,
    base: Instant,
}

/// One connection as the cap sees it.
struct Conn {
    /// When a byte was last read or written, in ms after `base`.
    last: AtomicU64,
    base: Instant,
    /// Requests in progress (from the head to the end of the response body).
    busy: AtomicUsize,
    /// Closes the connection (evicted, or the shutdown's time is up).
    close: Notify,
    /// Notified once the connection is closed and its slot free.
    gone: Notify,
}

impl Conn {
    fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    fn last_activity(&self) -> Instant {
        self.base + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }

    /// Completes once nothing was read or written for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let at = self.last_activity() + timeout;
            if Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }
}

impl Connections {
    pub(crate) fn new(cap: usize) -> Arc<Connections> {
        Arc::new(Connections {
            cap,
            slots: Arc::new(Semaphore::new(cap)),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            at_cap: AtomicBool::new(false),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            base: Instant::now(),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.locked()
    }

    /// A slot for a new connection: a free one, or the one of the connection
    /// idle longest, which is closed for it. `None`: every connection is busy.
    async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            if self.slots.available_permits() >= self.cap / 10
                && self.at_cap.swap(false, Ordering::Relaxed)
            {
                tracing::info!(
                    evicted = self.evicted.swap(0, Ordering::Relaxed),
                    refused = self.refused.swap(0, Ordering::Relaxed),
                    "below the connection cap again"
                );
            }
            return Some(permit);
        }
        if !self.at_cap.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_connections = self.cap,
                "{} connections are open, the most this server accepts ([service] \
                 max_connections): closing the longest-idle ones to make room",
                self.cap
            );
        }
        if self.evict_idlest().is_none() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // Its task ends at once and gives its slot back.
        match tokio::time::timeout(Duration::from_secs(1), self.slots.clone().acquire_owned()).await
        {
            Ok(Ok(permit)) => Some(permit),
            _ => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Tells the connection idle longest (no request in progress) to close;
    /// `None` if every connection has a request in progress.
    fn evict_idlest(&self) -> Option<Arc<Conn>> {
        let idlest = self
            .open()
            .values()
            .filter(|c| c.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|c| c.last.load(Ordering::Relaxed))
            .cloned()?;
        idlest.close.notify_one();
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Some(idlest)
    }

    /// Closes every connection still open (the shutdown's time is up).
    pub(crate) fn close_all(&self) {
        for conn in self.open().values() {
            conn.close.notify_one();
        }
    }

    /// Completes once every connection is closed.
    async fn drained(&self) {
        let all = u32::try_from(self.cap).unwrap_or(u32::MAX);
        let _ = self.slots.acquire_many(all).await;
    }
}

/// Removes its connection from the open ones and frees its slot, however the
/// connection's task ends.
struct Registered {
    connections: Arc<Connections>,
    id: u64,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // (The connection's socket is closed by now: dropped before this.)
        if let Some(conn) = self.connections.open().remove(&self.id) {
            conn.gone.notify_one();
        }
    }
}

/// Accepts on `listener` until `shutdown` is set, then lets every connection
/// finish its request and close, and returns once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServiceLimits,
    connections: Arc<Connections>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Both: the buffer never grows past the head's cap (a body is read
        // through it in pieces), and a head beyond it is answered 431.
        .max_buf_size(limits.max_head_size.max(MIN_BUF_SIZE))
        .max_header_size(limits.max_head_size)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let service = TowerToHyperService::new(router);
    let mut errors = AcceptErrors::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                errors.recovered();
                stream
            }
            Err(error) if out_of_files(&error) && !*shutdown.borrow() => {
                // Out of file descriptors (taken by more than connections,
                // or a limit lowered since the start): an idle connection
                // gives its one up, so that new ones (a health check) get in.
                errors.failed(&error);
                if let Some(idlest) = connections.evict_idlest() {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), idlest.gone.notified()).await;
                } else {
                    tokio::select! {
                        () = tokio::time::sleep(backoff(errors.in_a_row)) => {}
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                }
                continue;
            }
            Err(error) => {
                let pause = errors.failed(&error);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
                continue;
            }
        };
        let Some(slot) = connections.admit().await else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(Conn {
            last: AtomicU64::new(connections.base.elapsed().as_millis() as u64),
            base: connections.base,
            busy: AtomicUsize::new(0),
            close: Notify::new(),
            gone: Notify::new(),
        });
        let id = connections.next_id.fetch_add(1, Ordering::Relaxed);
        connections.open().insert(id, conn.clone());
        let registered = Registered {
            connections: connections.clone(),
            id,
            _slot: slot,
        };
        tokio::spawn(connection(
            stream,
            conn,
            registered,
            builder.clone(),
            service.clone(),
            limits,
            shutdown.clone(),
        ));
    }
    // No new connections from here on.
    drop(listener);
    connections.drained().await;
}

/// Serves one connection to its end.
async fn connection(
    stream: TcpStream,
    conn: Arc<Conn>,
    registered: Registered,
    builder: Arc<hyper::server::conn::http1::Builder>,
    service: TowerToHyperService<Router>,
    limits: ServiceLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let idle_timeout = limits.idle_timeout;
    let _registered = registered;
    let io = TokioIo::new(Tracked {
        stream,
        conn: conn.clone(),
    });
    let busy = conn.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let guard = Busy::new(busy.clone());
        let request = request.map(|body| TimedBody::new(body, limits.body_read_timeout));
        let response = hyper::service::Service::call(&service, request);
        // Boxed: the connection is polled without shutting its stream down
        // (see below), which wants the service's future `Unpin`.
        Box::pin(async move {
            let response = response.await?;
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(BusyBody {
                    body,
                    _guard: guard,
                })
            }))
        })
    });
    let mut served = builder.serve_connection(io, service);
    let mut draining = false;
    let ended = loop {
        tokio::select! {
            result = std::future::poll_fn(|cx| served.poll_without_shutdown(cx)) => break result,
            _ = shutdown.wait_for(|stop| *stop), if !draining => {
                // Finishes the request in progress, then closes.
                Pin::new(&mut served).graceful_shutdown();
                draining = true;
            }
            () = conn.close.notified() => return,
            () = conn.idle_for(idle_timeout) => {
                tracing::debug!("connection idle for {idle_timeout:?}; closed");
                return;
            }
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%error, "connection ended");
    }
    let stream = served.into_parts().io.into_inner().stream;
    linger(stream, &conn).await;
}

/// How long a closing connection keeps reading (and dropping) what its
/// client still sends, and how much of it at most.
const LINGER: Duration = Duration::from_secs(5);
const LINGER_BYTES: usize = 1 << 20;

/// Closes a connection the server is done with so that its client reads the
/// last answer: ends the writing side, then reads and drops what the client
/// still sends (the rest of an oversized head answered 431, a body answered
/// 413 before it was read) until it closes too, for at most [`LINGER`] and
/// [`LINGER_BYTES`]. Closing a socket with input unread sends a reset, which
/// can destroy the answer before the client reads it (RFC 9112 §9.6).
async fn linger(mut stream: TcpStream, conn: &Conn) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    tokio::select! {
        () = drain => {}
        () = tokio::time::sleep(LINGER) => {}
        () = conn.close.notified() => {}
    }
}

/// A request in progress on its connection, from its head to the end of its
/// response body: the connection is not idle meanwhile.
struct Busy(Arc<Conn>);

impl Busy {
    fn new(conn: Arc<Conn>) -> Busy {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        Busy(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A response body that keeps its connection busy until it is sent.
struct BusyBody {
    body: Body,
    _guard: Busy,
}

impl hyper::body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The smallest buffer hyper's HTTP/1 parser takes (it panics below it).
const MIN_BUF_SIZE: usize = 8192;

/// A request body that must end within the body read timeout of its head.
struct TimedBody {
    body: Incoming,
    /// When the whole body must be in.
    deadline: Instant,
    /// Made at the first wait for more of the body (most requests have none).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
}

impl TimedBody {
    fn new(body: Incoming, timeout: Duration) -> TimedBody {
        TimedBody {
            body,
            deadline: Instant::now() + timeout,
            timer: None,
            timeout,
        }
    }
}

/// A request body did not arrive within `[service] body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body did not arrive within {} of its head ([service] body_read_timeout)",
    arbor_actors::duration::Human(*.0)
)]
pub(crate) struct BodyTimeout(pub(crate) Duration);

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match std::future::Future::poll(timer.as_mut(), cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimeout(this.timeout).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A TCP stream that notes when a byte last went either way.
struct Tracked {
    stream: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn.touch();
        }
        read
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.conn.touch();
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.conn.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Accept errors in a row: how long to pause, logged once per episode.
#[derive(Default)]
struct AcceptErrors {
    in_a_row: u32,
}

impl AcceptErrors {
    /// The pause before the next accept (none for errors of one connection,
    /// which the peer caused: it reset or aborted before it was accepted).
    fn failed(&mut self, error: &io::Error) -> Duration {
        if matches!(
            error.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
        ) {
            return Duration::ZERO;
        }
        if self.in_a_row == 0 {
            tracing::warn!(%error, "cannot accept connections; retrying with backoff");
        }
        self.in_a_row = self.in_a_row.saturating_add(1);
        backoff(self.in_a_row)
    }

    fn recovered(&mut self) {
        if self.in_a_row > 0 {
            tracing::info!(errors = self.in_a_row, "accepting connections again");
            self.in_a_row = 0;
        }
    }
}

/// Whether the process (EMFILE) or the system (ENFILE) is out of file
/// descriptors.
fn out_of_files(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(23 | 24))
}

/// 10 ms after the first error in a row, doubling, at most 1 s.
fn backoff(in_a_row: u32) -> Duration {
    let exponent = in_a_row.saturating_sub(1).min(7);
    Duration::from_millis(10 << exponent).min(Duration::from_secs(1))
}

/// The process's soft limit on open files, raised to its hard limit first
/// (as Go's runtime does): a server's connections each take one.
pub(crate) fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_from_10ms_to_1s() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn an_aborted_connection_is_retried_at_once_and_out_of_files_is_backed_off() {
        let mut errors = AcceptErrors::default();
        let reset = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(errors.failed(&reset), Duration::ZERO);
        let emfile = io::Error::from_raw_os_error(24);
        assert_eq!(errors.failed(&emfile), Duration::from_millis(10));
        assert_eq!(errors.failed(&emfile), Duration::from_millis(20));
        errors.recovered();
        assert_eq!(errors.failed(&emfile), Duration::from_millis(10));
    }

    fn conn(base: Instant, last_ms: u64, busy: usize) -> Arc<Conn> {
        Arc::new(Conn {
            last: AtomicU64::new(last_ms),
            base,
            busy: AtomicUsize::new(busy),
            close: Notify::new(),
            gone: Notify::new(),
        })
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room_and_a_busy_one_never_does() {
        let connections = Connections::new(3);
        let base = connections.base;
        let conns = [conn(base, 5, 0), conn(base, 1, 1), conn(base, 3, 0)];
        let mut slots = Vec::new();
        for (id, c) in conns.iter().enumerate() {
            slots.push(connections.admit().await.unwrap());
            connections.open().insert(id as u64, c.clone());
        }
        // Full: the idlest connection without a request (id 2; id 1 is busy)
        // is told to close; when its slot comes back, the new one has it.
        let admitting = tokio::spawn({
            let connections = connections.clone();
            async move { connections.admit().await }
        });
        tokio::time::timeout(Duration::from_secs(5), conns[2].close.notified())
            .await
            .unwrap();
        connections.open().remove(&2);
        drop(slots.pop());
        let _admitted = admitting.await.unwrap().unwrap();
        assert!(connections.at_cap.load(Ordering::Relaxed));
        assert_eq!(connections.evicted.load(Ordering::Relaxed), 1);
        // Every connection left busy: the new one is refused at once.
        conns[0].busy.store(1, Ordering::Relaxed);
        assert!(connections.admit().await.is_none());
        assert_eq!(connections.refused.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_once_nothing_moved_for_the_timeout() {
        let base = Instant::now();
        let c = conn(base, 0, 0);
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(30)).await;
        c.touch();
        c.idle_for(Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(90));
    }
}
