//! The HTTP/1.1 accept loop, with the limits `axum::serve` lacks: a cap on open connections, a
//! header-read timeout and an idle keep-alive timeout, so that slow or idle clients cannot hold
//! the server's sockets (slowloris).
//!
//! Each connection is in one of three phases: reading a request head (from being accepted, or
//! from the first byte of a later request), busy (requests in flight, however long they
//! stream), or idle between requests. Heads must be complete within the header-read timeout
//! and idle connections close after the keep-alive timeout; busy ones are never timed out.
//!
//! At the cap, a new connection replaces the longest-waiting connection that has no request in
//! flight (as nginx closes idle keep-alive connections when it runs short), so stalled clients
//! cannot lock others out: `/health` and real requests still get in while thousands of slow
//! connections come and go. Only when every connection is busy does a new one wait for a slot.
//!
//! On shutdown the listener closes, connections without a request in flight close at once, and
//! busy ones finish their requests and then close.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// File descriptors kept for everything but client connections (model files, the listener,
/// the runtime, logs) when the open-file limit lowers the connection cap.
#[cfg(unix)]
const RESERVED_FDS: libc::rlim_t = 64;

/// How long to wait after an accept error other than a client's (EMFILE, ENOMEM) before trying
/// again, instead of spinning on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(200);

/// The connection limits of `pagoda serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a request head may take, from accept or from a later request's first byte.
    pub header_read_timeout: Duration,
    /// How long an idle connection waits for its next request; zero disables keep-alive.
    pub keep_alive_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    Head,
    /// Requests in flight.
    Busy,
    /// Between requests.
    Idle,
}

#[derive(Debug)]
struct Activity {
    phase: Phase,
    /// When the phase began.
    since: Instant,
    in_flight: usize,
    /// Asked to close (to make room) as soon as it is not busy.
    evicted: bool,
}

fn deadline(a: &Activity, limits: &ConnectionLimits) -> Option<Instant> {
    match a.phase {
        Phase::Head => Some(a.since + limits.header_read_timeout),
        Phase::Idle => Some(a.since + limits.keep_alive_timeout),
        Phase::Busy => None,
    }
}

/// One connection's phase, shared by its I/O, its requests, its task and the accept loop.
#[derive(Debug)]
struct Conn {
    activity: Mutex<Activity>,
    /// Wakes the connection's task: its deadline moved, or it was evicted.
    wake: Notify,
    /// Wakes an accept loop waiting for a connection it may evict.
    became_idle: Arc<Notify>,
}

impl Conn {
    fn new(now: Instant, became_idle: Arc<Notify>) -> Self {
        let activity = Activity { phase: Phase::Head, since: now, in_flight: 0, evicted: false };
        Self { activity: Mutex::new(activity), wake: Notify::new(), became_idle }
    }

    fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived: on an idle connection they start a request head, whose clock starts now.
    fn on_bytes(&self, now: Instant) {
        let mut a = self.activity();
        if a.phase == Phase::Idle {
            a.phase = Phase::Head;
            a.since = now;
            drop(a);
            self.wake.notify_one();
        }
    }

    /// A request head was read and handed to the router.
    fn request_started(&self, now: Instant) {
        let mut a = self.activity();
        a.in_flight += 1;
        a.phase = Phase::Busy;
        a.since = now;
    }

    /// A response was sent (or dropped).
    fn request_finished(&self, now: Instant) {
        let mut a = self.activity();
        a.in_flight = a.in_flight.saturating_sub(1);
        if a.in_flight == 0 {
            a.phase = Phase::Idle;
            a.since = now;
            drop(a);
            self.wake.notify_one();
            self.became_idle.notify_one();
        }
    }

    /// When the current phase times out; `None` while busy.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        deadline(&self.activity(), limits)
    }

    /// Whether the connection should close now: not busy, and timed out or evicted.
    fn should_close(&self, now: Instant, limits: &ConnectionLimits) -> bool {
        let a = self.activity();
        deadline(&a, limits).is_some_and(|d| a.evicted || now >= d)
    }

    fn phase(&self) -> Phase {
        self.activity().phase
    }

    fn evict(&self) {
        self.activity().evicted = true;
        self.wake.notify_one();
    }
}

/// Every open connection, for choosing which one makes room at the cap.
#[derive(Debug, Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    became_idle: Arc<Notify>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(self: &Arc<Self>, now: Instant) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(now, Arc::clone(&self.became_idle)));
        self.lock().insert(id, Arc::clone(&conn));
        Registered { registry: Arc::clone(self), id, conn }
    }

    /// Asks the longest-waiting connection without a request in flight to close, unless one
    /// asked before has yet to. Returns whether a connection is on its way out.
    fn evict_one(&self) -> bool {
        let conns = self.lock();
        let mut oldest: Option<(Instant, &Arc<Conn>)> = None;
        for conn in conns.values() {
            let a = conn.activity();
            if a.phase == Phase::Busy {
                continue;
            }
            if a.evicted {
                return true;
            }
            if oldest.is_none_or(|(since, _)| a.since < since) {
                oldest = Some((a.since, conn));
            }
        }
        oldest.map(|(_, conn)| conn.evict()).is_some()
    }
}

/// A connection's entry in the registry, removed when the connection's task ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

/// A slot for one more connection: free, made by evicting one, or waited for.
async fn slot(permits: &Arc<Semaphore>, registry: &Registry) -> OwnedSemaphorePermit {
    loop {
        if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
            return permit;
        }
        // Registered before evicting, so that a connection going idle meanwhile is not missed.
        let mut idle = pin!(registry.became_idle.notified());
        idle.as_mut().enable();
        registry.evict_one();
        tokio::select! {
            permit = Arc::clone(permits).acquire_owned() => {
                // The semaphore is never closed.
                if let Ok(permit) = permit {
                    return permit;
                }
            }
            () = idle => {}
        }
    }
}

/// Marks a request in flight from its head until its response body is dropped.
struct InFlight(Arc<Conn>);

impl InFlight {
    fn new(conn: Arc<Conn>) -> Self {
        conn.request_started(Instant::now());
        Self(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished(Instant::now());
    }
}

/// A response body that keeps its request in flight until hyper has taken all of it (or
/// dropped it).
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The socket, noticing when bytes arrive on an idle connection.
struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.on_bytes(Instant::now());
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves one connection until it ends, times out, is evicted, or (once draining) has no
/// request left in flight.
async fn connection(
    stream: TcpStream,
    registered: Registered,
    router: Router,
    limits: ConnectionLimits,
    mut drain: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let conn = Arc::clone(&registered.conn);
    let service_conn = Arc::clone(&conn);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let in_flight = InFlight::new(Arc::clone(&service_conn));
        let router = router.clone();
        async move {
            let response = router.oneshot(req.map(Body::new)).await.unwrap_or_else(|e| match e {});
            Ok::<_, Infallible>(response.map(|body| TrackedBody { body, _in_flight: in_flight }))
        }
    });
    let io = TokioIo::new(Watched { stream, conn: Arc::clone(&conn) });
    let mut http = pin!(hyper::server::conn::http1::Builder::new()
        .keep_alive(!limits.keep_alive_timeout.is_zero())
        // Timed here instead, together with the keep-alive timeout and evictions.
        .header_read_timeout(None)
        .serve_connection(io, service));
    let mut draining = false;
    // When an idle connection was told to close: hyper closes it once the last response is
    // written, which a client that reads nothing could put off for ever.
    let mut closing: Option<Instant> = None;
    loop {
        let deadline = match closing {
            Some(since) => Some(since + limits.header_read_timeout),
            None => conn.deadline(&limits),
        };
        let expiry = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = http.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            () = expiry => {}
            () = conn.wake.notified() => {}
            _ = drain.changed(), if !draining => {
                draining = true;
                http.as_mut().graceful_shutdown();
            }
        }
        let now = Instant::now();
        if closing.is_some_and(|since| now >= since + limits.header_read_timeout) {
            break;
        }
        let phase = conn.phase();
        if closing.is_none() && (conn.should_close(now, &limits) || (draining && phase != Phase::Busy)) {
            tracing::debug!(?phase, "closing a connection without a request in flight");
            match phase {
                // Nothing is being answered: the socket can go now.
                Phase::Head => break,
                // The last response may still be in hyper's buffer: hyper closes after it.
                Phase::Idle => {
                    http.as_mut().graceful_shutdown();
                    closing = Some(now);
                }
                Phase::Busy => {}
            }
        }
    }
    drop(registered);
}

/// The connection cap the open-file limit allows: raises the soft limit towards the hard one
/// if `requested` needs it, and lowers the cap (with a warning) if that is not enough.
fn connection_cap(requested: usize) -> usize {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct we pass; setrlimit only reads it.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return requested;
        }
        let needed = (requested as libc::rlim_t).saturating_add(RESERVED_FDS);
        if limit.rlim_cur < needed && limit.rlim_max > limit.rlim_cur {
            let raised = libc::rlimit { rlim_cur: needed.min(limit.rlim_max), rlim_max: limit.rlim_max };
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        let allowed = limit.rlim_cur.saturating_sub(RESERVED_FDS).max(1);
        if (requested as libc::rlim_t) > allowed {
            tracing::warn!(
                requested,
                allowed,
                open_file_limit = limit.rlim_cur,
                "--max-connections is above what the open-file limit (ulimit -n) allows; using the lower cap"
            );
            return usize::try_from(allowed).unwrap_or(requested);
        }
    }
    requested
}

/// Errors a client causes (it went away before being accepted): not worth a pause.
fn is_client_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Serves `router` on `listener` until `shutdown` resolves, then closes the listener and waits
/// until every connection has closed (busy ones after their requests). Dropping the future
/// closes every connection at once.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let limits = ConnectionLimits { max_connections: connection_cap(limits.max_connections), ..limits };
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let registry = Arc::new(Registry::default());
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // Finished connections' results (a panic was already reported by the panic hook).
        while tasks.try_join_next().is_some() {}
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_client_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                    }
                }
            },
        };
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = slot(&permits, &registry) => permit,
        };
        let registered = registry.insert(Instant::now());
        tasks.spawn(connection(stream, registered, router.clone(), limits, drain_rx.clone(), permit));
    }
    drop(listener);
    let _ = drain_tx.send(true);
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(10),
        keep_alive_timeout: Duration::from_secs(75),
        max_connections: 4,
    };

    #[test]
    fn each_phase_has_its_own_deadline() {
        let t0 = Instant::now();
        let conn = Conn::new(t0, Arc::default());
        assert_eq!(conn.deadline(&LIMITS), Some(t0 + Duration::from_secs(10)));
        // Bytes of a head in progress do not move its deadline.
        conn.on_bytes(t0 + Duration::from_secs(5));
        assert_eq!(conn.deadline(&LIMITS), Some(t0 + Duration::from_secs(10)));
        assert!(conn.should_close(t0 + Duration::from_secs(10), &LIMITS));

        conn.request_started(t0 + Duration::from_secs(1));
        assert_eq!(conn.deadline(&LIMITS), None);
        assert!(!conn.should_close(t0 + Duration::from_secs(3600), &LIMITS));

        let t1 = t0 + Duration::from_secs(100);
        conn.request_finished(t1);
        assert_eq!(conn.deadline(&LIMITS), Some(t1 + Duration::from_secs(75)));
        // The next request's first byte starts its header-read clock.
        let t2 = t1 + Duration::from_secs(30);
        conn.on_bytes(t2);
        assert_eq!(conn.deadline(&LIMITS), Some(t2 + Duration::from_secs(10)));
    }

    #[test]
    fn pipelined_requests_keep_the_connection_busy_until_the_last_ends() {
        let t0 = Instant::now();
        let conn = Conn::new(t0, Arc::default());
        conn.request_started(t0);
        conn.request_started(t0);
        conn.request_finished(t0);
        assert_eq!(conn.phase(), Phase::Busy);
        conn.request_finished(t0);
        assert_eq!(conn.phase(), Phase::Idle);
    }

    #[test]
    fn eviction_takes_the_longest_waiting_connection_that_is_not_busy() {
        let registry = Arc::new(Registry::default());
        let t0 = Instant::now();
        let busy = registry.insert(t0);
        busy.conn.request_started(t0);
        let old = registry.insert(t0 + Duration::from_secs(1));
        let new = registry.insert(t0 + Duration::from_secs(2));
        assert!(registry.evict_one());
        assert!(old.conn.should_close(t0, &LIMITS));
        assert!(!new.conn.should_close(t0, &LIMITS));
        assert!(!busy.conn.should_close(t0, &LIMITS));
        // Until the evicted one is gone, nobody else is asked.
        assert!(registry.evict_one());
        assert!(!new.conn.should_close(t0, &LIMITS));
        drop(old);
        assert!(registry.evict_one());
        assert!(new.conn.should_close(t0, &LIMITS));
        drop(new);
        // Busy connections are never evicted.
        assert!(!registry.evict_one());
        assert!(!busy.conn.should_close(t0, &LIMITS));
    }

    #[test]
    fn an_evicted_connection_that_just_got_a_request_finishes_it_first() {
        let registry = Arc::new(Registry::default());
        let t0 = Instant::now();
        let conn = registry.insert(t0);
        assert!(registry.evict_one());
        conn.conn.request_started(t0);
        assert!(!conn.conn.should_close(t0, &LIMITS));
        conn.conn.request_finished(t0);
        assert!(conn.conn.should_close(t0, &LIMITS));
    }

    #[test]
    fn the_cap_fits_the_open_file_limit() {
        // Far above any open-file limit: lowered, and still at least one.
        let cap = connection_cap(usize::MAX / 2);
        assert!((1..usize::MAX / 2).contains(&cap));
        assert_eq!(connection_cap(1), 1);
    }
}
