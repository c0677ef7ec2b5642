//! The TCP transport: a producer's listener that answers fetches from its [`KvSource`], and
//! [`TcpConnector`], the consumer's client. One fetch per connection.
//!
//! Neither side trusts the other's numbers: the listener bounds how many connections wait, how
//! long one may stay silent before its fetch and how long a write may take; the client checks
//! an answer's header size, layout, block count and byte count against what its request can
//! use before it allocates room for the pages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::protocol::{read_frame_within, write_frame, FetchRequest, FetchResponse, Status, VERSION};
use crate::{BoxFuture, FetchSpec, HeldExport, KvConnector, KvPageLayout, KvPrefix, KvSource, TransferError};

/// How often a fetch for a key not held yet looks again (the prefill may still be running).
const POLL: Duration = Duration::from_millis(20);
/// How long sending one answer may take before the reader is taken to be gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Fetches answered at once; more wait for a slot (each waiting one polls the engine).
const MAX_CONNECTIONS: usize = 64;
/// Connections that have not sent their fetch yet; one more is closed at once. They hold no
/// answer slot, so however many sit silent, a real fetch is answered.
const MAX_SILENT_CONNECTIONS: usize = 256;
/// Largest fetch request read: a key and a model name.
const MAX_REQUEST_BYTES: usize = 64 << 10;
/// An answer's JSON besides its token ids (the layout, an FP8 cache's scales).
const RESPONSE_HEADER_BASE_BYTES: usize = 64 << 10;
/// The most bytes one token id takes in the answer's JSON (`4294967295,`).
const TOKEN_ID_JSON_BYTES: usize = 11;
/// What the consumer leaves the producer to answer in, before its own deadline.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// Serves fetches on `listener` until the task is dropped, waiting at most `max_wait` for a key
/// that is not held yet and at most `idle_timeout` for a connection's fetch.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn KvSource>,
    max_wait: Duration,
    idle_timeout: Duration,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let silent = Arc::new(Semaphore::new(MAX_SILENT_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "KV transfer listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(unheard) = Arc::clone(&silent).try_acquire_owned() else {
            tracing::debug!(%peer, "KV transfer: too many connections have not sent a fetch; closing this one");
            continue;
        };
        let (source, slots) = (Arc::clone(&source), Arc::clone(&slots));
        tokio::spawn(async move {
            if let Err(err) = answer(stream, source.as_ref(), &slots, unheard, max_wait, idle_timeout).await {
                tracing::warn!(%peer, %err, "KV transfer: fetch failed");
            }
        });
    }
}

/// Reads one fetch (within `idle_timeout`, holding `unheard` meanwhile), then answers it in one
/// of the `slots`.
async fn answer(
    mut stream: TcpStream,
    source: &dyn KvSource,
    slots: &Semaphore,
    unheard: OwnedSemaphorePermit,
    max_wait: Duration,
    idle_timeout: Duration,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let request: FetchRequest =
        tokio::time::timeout(idle_timeout, read_frame_within(&mut stream, MAX_REQUEST_BYTES))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no fetch within idle_timeout_s")
            })??;
    drop(unheard);
    let deadline = Instant::now() + Duration::from_millis(request.wait_ms).min(max_wait);
    let Ok(_slot) = slots.acquire().await else { return Ok(()) };
    let refusal = if request.version != VERSION {
        Some(format!("protocol version {} is not {VERSION}", request.version))
    } else if request.model != source.model() {
        Some(format!("this instance serves model {:?}, not {:?}", source.model(), request.model))
    } else {
        None
    };
    if let Some(msg) = refusal {
        return send(&mut stream, &FetchResponse::failed(Status::Error, msg), &[]).await;
    }
    let prefix = loop {
        match source.take(&request.key).await {
            Ok(HeldExport::Ready(prefix)) => break prefix,
            Ok(HeldExport::Pending) if Instant::now() + POLL < deadline => tokio::time::sleep(POLL).await,
            Ok(HeldExport::Pending) => {
                let msg = "nothing was held under it in time".to_owned();
                return send(&mut stream, &FetchResponse::failed(Status::NotFound, msg), &[]).await;
            }
            Ok(HeldExport::Gone(reason)) => {
                return send(&mut stream, &FetchResponse::failed(Status::NotFound, reason), &[]).await
            }
            Err(msg) => return send(&mut stream, &FetchResponse::failed(Status::Error, msg), &[]).await,
        }
    };
    let response = FetchResponse {
        version: VERSION,
        status: Status::Ok,
        message: None,
        layout: Some((&prefix.layout).into()),
        token_ids: prefix.token_ids,
        pages_len: prefix.pages.len() as u64,
    };
    send(&mut stream, &response, &prefix.pages).await
}

/// Writes one answer and its pages, within [`WRITE_TIMEOUT`].
async fn send(stream: &mut TcpStream, response: &FetchResponse, pages: &[u8]) -> std::io::Result<()> {
    let write = async {
        write_frame(stream, response).await?;
        stream.write_all(pages).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the reader stopped reading"))?
}

/// Fetches over TCP from the producer's listener.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl KvConnector for TcpConnector {
    fn fetch<'a>(
        &'a self,
        spec: &'a FetchSpec,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<KvPrefix, TransferError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(deadline, fetch(spec, deadline.into_std())).await {
                Ok(result) => result,
                Err(_) => Err(TransferError::Timeout),
            }
        })
    }
}

async fn fetch(spec: &FetchSpec, deadline: Instant) -> Result<KvPrefix, TransferError> {
    let source = &spec.source;
    let addr = source.addr();
    let mut stream = TcpStream::connect(&addr)
        .await
        .map_err(|e| TransferError::Connect { addr: addr.clone(), source: e })?;
    stream.set_nodelay(true)?;
    // Ask the producer to stop waiting before we do, so its answer still arrives.
    let left = deadline.saturating_duration_since(Instant::now());
    let wait = left.saturating_sub(ANSWER_MARGIN.min(left / 2));
    let request = FetchRequest {
        version: VERSION,
        key: source.key.clone(),
        model: spec.model.clone(),
        wait_ms: wait.as_millis() as u64,
    };
    write_frame(&mut stream, &request).await?;
    let response: FetchResponse =
        read_frame_within(&mut stream, response_header_limit(spec)).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => TransferError::Protocol(e.to_string()),
            _ => TransferError::Io(e),
        })?;
    match response.status {
        Status::Ok => {}
        Status::NotFound => {
            let reason = response.message.unwrap_or_default();
            return Err(TransferError::NotFound { key: source.key.clone(), reason });
        }
        Status::Error => return Err(TransferError::Refused(response.message.unwrap_or_default())),
    }
    let layout: KvPageLayout = response
        .layout
        .ok_or_else(|| TransferError::Protocol("an ok answer without a layout".into()))?
        .into();
    let pages_len = expected_pages_len(spec, &layout, response.token_ids.len())?;
    if response.pages_len != pages_len as u64 {
        let msg = format!(
            "{} bytes of pages announced for {} tokens, expected {pages_len}",
            response.pages_len,
            response.token_ids.len()
        );
        return Err(TransferError::Protocol(msg));
    }
    let mut pages = vec![0u8; pages_len];
    stream.read_exact(&mut pages).await?;
    Ok(KvPrefix { layout, token_ids: response.token_ids, pages })
}

/// The largest answer header a fetch for `spec` can need: its token ids, at most
/// `spec.max_blocks` blocks of them, and the layout.
fn response_header_limit(spec: &FetchSpec) -> usize {
    spec.max_blocks
        .saturating_mul(spec.layout.block_size)
        .saturating_mul(TOKEN_ID_JSON_BYTES)
        .saturating_add(RESPONSE_HEADER_BASE_BYTES)
}

/// The bytes an answer of `num_tokens` in `layout` must carry, when it is one this instance
/// can take: its own layout, whole blocks, at most `spec.max_blocks` of them.
fn expected_pages_len(
    spec: &FetchSpec,
    layout: &KvPageLayout,
    num_tokens: usize,
) -> Result<usize, TransferError> {
    if *layout != spec.layout {
        return Err(TransferError::Refused(format!(
            "the prefill's KV layout {layout:?} is not this cache's {:?}",
            spec.layout
        )));
    }
    let bs = layout.block_size.max(1);
    let blocks = num_tokens / bs;
    if !num_tokens.is_multiple_of(bs) || blocks > spec.max_blocks {
        return Err(TransferError::Protocol(format!(
            "{num_tokens} tokens are not at most {} whole blocks of {bs}",
            spec.max_blocks
        )));
    }
    layout
        .checked_block_bytes()
        .and_then(|b| b.checked_mul(blocks))
        .ok_or_else(|| TransferError::Protocol("the announced pages overflow".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{read_frame, WireLayout};
    use crate::TransferSource;
    use std::sync::Mutex;

    /// Holds one prefix under "k", from `ready_at` on; "bad" is an engine error, "gone" a key
    /// whose prefill failed.
    struct OneKey {
        prefix: Mutex<Option<KvPrefix>>,
        ready_at: Instant,
    }

    impl KvSource for OneKey {
        fn take<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<HeldExport, String>> {
            Box::pin(async move {
                match key {
                    "bad" => Err("the engine refused".into()),
                    "gone" => Ok(HeldExport::Gone("the prefill did not finish".into())),
                    "k" if Instant::now() >= self.ready_at => Ok(match self.prefix.lock().unwrap().take() {
                        Some(prefix) => HeldExport::Ready(prefix),
                        None => HeldExport::Gone("the blocks were already read".into()),
                    }),
                    _ => Ok(HeldExport::Pending),
                }
            })
        }

        fn model(&self) -> &str {
            "m"
        }
    }

    fn layout() -> KvPageLayout {
        KvPageLayout {
            dtype: "bf16".into(),
            element_bytes: 2,
            num_layers: 2,
            block_size: 4,
            num_kv_heads: 1,
            head_dim: 2,
            scales: Vec::new(),
        }
    }

    fn prefix() -> KvPrefix {
        let pages = (0..2 * layout().block_bytes()).map(|i| i as u8).collect();
        KvPrefix { layout: layout(), token_ids: (0..8).collect(), pages }
    }

    fn spec(port: u16, key: &str) -> FetchSpec {
        let source = TransferSource { host: "127.0.0.1".into(), port, key: key.into() };
        FetchSpec { source, model: "m".into(), layout: layout(), max_blocks: 16 }
    }

    async fn producer(ready_in: Duration) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let source =
            Arc::new(OneKey { prefix: Mutex::new(Some(prefix())), ready_at: Instant::now() + ready_in });
        tokio::spawn(serve(listener, source, Duration::from_secs(5), Duration::from_millis(300)));
        port
    }

    fn within(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn a_fetch_waits_for_the_prefill_and_takes_the_prefix_once() {
        let port = producer(Duration::from_millis(150)).await;
        let got = TcpConnector.fetch(&spec(port, "k"), within(5000)).await.unwrap();
        assert_eq!(got, prefix());
        // Read once: the second fetch hears at once that it is gone.
        let started = Instant::now();
        let again = TcpConnector.fetch(&spec(port, "k"), within(5000)).await;
        assert!(
            matches!(again, Err(TransferError::NotFound { ref reason, .. }) if reason.contains("already read")),
            "{again:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn failures_are_told_apart() {
        let port = producer(Duration::from_secs(3600)).await;
        let late = TcpConnector.fetch(&spec(port, "k"), within(1500)).await;
        assert!(matches!(late, Err(TransferError::NotFound { .. })), "{late:?}");
        let refused = TcpConnector.fetch(&spec(port, "bad"), within(2000)).await;
        assert!(
            matches!(refused, Err(TransferError::Refused(ref m)) if m.contains("refused")),
            "{refused:?}"
        );
        let failed = TcpConnector.fetch(&spec(port, "gone"), within(2000)).await;
        assert!(
            matches!(failed, Err(TransferError::NotFound { ref reason, .. }) if reason.contains("did not finish")),
            "{failed:?}"
        );
        let other_model = FetchSpec { model: "other".into(), ..spec(port, "k") };
        let refused = TcpConnector.fetch(&other_model, within(2000)).await;
        assert!(matches!(refused, Err(TransferError::Refused(ref m)) if m.contains("model")), "{refused:?}");
        // Nothing listens on a port just released.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let err = TcpConnector.fetch(&spec(closed, "k"), within(2000)).await.unwrap_err();
        assert_eq!(err.kind(), "connect");
    }

    #[tokio::test]
    async fn answers_this_instance_cannot_take_are_refused_before_reading_pages() {
        let port = producer(Duration::ZERO).await;
        let other = FetchSpec { layout: KvPageLayout { num_kv_heads: 2, ..layout() }, ..spec(port, "k") };
        let err = TcpConnector.fetch(&other, within(2000)).await.unwrap_err();
        assert!(matches!(err, TransferError::Refused(ref m) if m.contains("layout")), "{err:?}");
        // FP8 pages under other scales are other values.
        let scaled = KvPageLayout { scales: vec![[0.5f32.to_bits(), 1f32.to_bits()]; 2], ..layout() };
        let other = FetchSpec { layout: scaled.clone(), ..spec(producer(Duration::ZERO).await, "k") };
        let err = TcpConnector.fetch(&other, within(2000)).await.unwrap_err();
        assert!(matches!(err, TransferError::Refused(ref m) if m.contains("layout")), "{err:?}");
        // Scales cross the wire exactly, and a layout without them carries none.
        let wire = serde_json::to_string(&WireLayout::from(&scaled)).unwrap();
        assert_eq!(KvPageLayout::from(serde_json::from_str::<WireLayout>(&wire).unwrap()), scaled);
        assert!(!serde_json::to_string(&WireLayout::from(&layout())).unwrap().contains("scales"));
        // A producer announcing more than the cache holds, or more bytes than its blocks need.
        let small = FetchSpec { max_blocks: 1, ..spec(producer(Duration::ZERO).await, "k") };
        let err = TcpConnector.fetch(&small, within(2000)).await.unwrap_err();
        assert_eq!(err.kind(), "protocol", "{err:?}");
        let liar = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let liar_port = liar.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = liar.accept().await.unwrap();
            let _: FetchRequest = read_frame(&mut stream).await.unwrap();
            let huge = FetchResponse {
                version: VERSION,
                status: Status::Ok,
                message: None,
                layout: Some((&layout()).into()),
                token_ids: (0..8).collect(),
                pages_len: u64::MAX,
            };
            write_frame(&mut stream, &huge).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let err = TcpConnector.fetch(&spec(liar_port, "k"), within(2000)).await.unwrap_err();
        assert_eq!(err.kind(), "protocol", "{err:?}");
    }

    #[tokio::test]
    async fn silent_connections_hold_no_answer_slot() {
        let port = producer(Duration::ZERO).await;
        let mut silent = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 8 {
            silent.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let got = TcpConnector.fetch(&spec(port, "k"), within(5000)).await.unwrap();
        assert_eq!(got, prefix());
        assert!(started.elapsed() < Duration::from_millis(250), "waited {:?}", started.elapsed());
        // And they are closed after the idle timeout.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), silent[0].read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }

    #[tokio::test]
    async fn an_answer_header_longer_than_the_request_can_use_is_refused() {
        let liar = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = liar.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = liar.accept().await.unwrap();
            let _: FetchRequest = read_frame(&mut stream).await.unwrap();
            // A header announcing 1 MiB of JSON, of which nothing follows.
            stream.write_all(crate::protocol::MAGIC).await.unwrap();
            stream.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let small = FetchSpec { max_blocks: 2, ..spec(port, "k") };
        let started = Instant::now();
        let err = TcpConnector.fetch(&small, within(3000)).await.unwrap_err();
        assert_eq!(err.kind(), "protocol", "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_silent_producer_times_out() {
        // Accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = tokio::spawn(async move {
            let (_stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let started = Instant::now();
        let err = TcpConnector.fetch(&spec(port, "k"), within(300)).await.unwrap_err();
        assert_eq!(err.kind(), "timeout");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
