//! The TCP transport: a producer's listener that answers fetches from its [`KvSource`], and
//! [`TcpConnector`], the consumer's client. One fetch per connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::protocol::{
    read_frame, write_frame, FetchRequest, FetchResponse, Status, MAX_PAGES_BYTES, VERSION,
};
use crate::{BoxFuture, KvConnector, KvPrefix, KvSource, TransferError, TransferSource};

/// How often a fetch for a key not held yet looks again (the prefill may still be running).
const POLL: Duration = Duration::from_millis(10);
/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves fetches on `listener` until the task is dropped, waiting at most `max_wait` for a key
/// that is not held yet.
pub async fn serve(listener: TcpListener, source: Arc<dyn KvSource>, max_wait: Duration) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "KV transfer listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            if let Err(err) = answer(stream, source.as_ref(), max_wait).await {
                tracing::warn!(%peer, %err, "KV transfer: fetch failed");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, source: &dyn KvSource, max_wait: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let request: FetchRequest = tokio::time::timeout(REQUEST_TIMEOUT, read_frame(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request"))??;
    if request.version != VERSION {
        let msg = format!("protocol version {} is not {VERSION}", request.version);
        return write_frame(&mut stream, &FetchResponse::failed(Status::Error, msg)).await;
    }
    let deadline = Instant::now() + Duration::from_millis(request.wait_ms).min(max_wait);
    let prefix = loop {
        match source.take(&request.key).await {
            Ok(Some(prefix)) => break prefix,
            Ok(None) if Instant::now() + POLL < deadline => tokio::time::sleep(POLL).await,
            Ok(None) => {
                let msg = format!("nothing is held under {:?}", request.key);
                return write_frame(&mut stream, &FetchResponse::failed(Status::NotFound, msg)).await;
            }
            Err(msg) => return write_frame(&mut stream, &FetchResponse::failed(Status::Error, msg)).await,
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
    write_frame(&mut stream, &response).await?;
    stream.write_all(&prefix.pages).await?;
    stream.shutdown().await
}

/// Fetches over TCP from the producer's listener.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl KvConnector for TcpConnector {
    fn fetch<'a>(
        &'a self,
        source: &'a TransferSource,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<KvPrefix, TransferError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(deadline, fetch(source, deadline.into_std())).await {
                Ok(result) => result,
                Err(_) => Err(TransferError::Timeout),
            }
        })
    }
}

async fn fetch(source: &TransferSource, deadline: Instant) -> Result<KvPrefix, TransferError> {
    let addr = source.addr();
    let mut stream = TcpStream::connect(&addr)
        .await
        .map_err(|e| TransferError::Connect { addr: addr.clone(), source: e })?;
    stream.set_nodelay(true)?;
    // Ask the producer to stop waiting a little before we do, so its answer still arrives.
    let wait = deadline.saturating_duration_since(Instant::now()).saturating_sub(Duration::from_millis(100));
    let request =
        FetchRequest { version: VERSION, key: source.key.clone(), wait_ms: wait.as_millis() as u64 };
    write_frame(&mut stream, &request).await?;
    let response: FetchResponse = read_frame(&mut stream).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => TransferError::Protocol(e.to_string()),
        _ => TransferError::Io(e),
    })?;
    match response.status {
        Status::Ok => {}
        Status::NotFound => return Err(TransferError::NotFound(source.key.clone())),
        Status::Error => return Err(TransferError::Refused(response.message.unwrap_or_default())),
    }
    let layout =
        response.layout.ok_or_else(|| TransferError::Protocol("an ok answer without a layout".into()))?;
    if response.pages_len > MAX_PAGES_BYTES {
        return Err(TransferError::Protocol(format!(
            "{} bytes of pages is over the limit",
            response.pages_len
        )));
    }
    let mut pages = vec![0u8; response.pages_len as usize];
    stream.read_exact(&mut pages).await?;
    let prefix = KvPrefix { layout: layout.into(), token_ids: response.token_ids, pages };
    prefix.check().map_err(TransferError::Protocol)?;
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_engine::KvPageLayout;
    use std::sync::Mutex;

    /// Holds one prefix under "k", from `ready_at` on.
    struct OneKey {
        prefix: Mutex<Option<KvPrefix>>,
        ready_at: Instant,
    }

    impl KvSource for OneKey {
        fn take<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KvPrefix>, String>> {
            Box::pin(async move {
                if key == "bad" {
                    return Err("the engine refused".into());
                }
                if key != "k" || Instant::now() < self.ready_at {
                    return Ok(None);
                }
                Ok(self.prefix.lock().unwrap().take())
            })
        }
    }

    fn prefix() -> KvPrefix {
        let layout = KvPageLayout {
            dtype: "bf16".into(),
            element_bytes: 2,
            num_layers: 2,
            block_size: 4,
            num_kv_heads: 1,
            head_dim: 2,
        };
        let pages = (0..2 * layout.block_bytes()).map(|i| i as u8).collect();
        KvPrefix { layout, token_ids: (0..8).collect(), pages }
    }

    async fn producer(ready_in: Duration) -> TransferSource {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let source =
            Arc::new(OneKey { prefix: Mutex::new(Some(prefix())), ready_at: Instant::now() + ready_in });
        tokio::spawn(serve(listener, source, Duration::from_secs(5)));
        TransferSource { host: "127.0.0.1".into(), port, key: "k".into() }
    }

    #[tokio::test]
    async fn a_fetch_waits_for_the_prefill_and_takes_the_prefix_once() {
        let source = producer(Duration::from_millis(150)).await;
        let deadline = Instant::now() + Duration::from_secs(3);
        let got = TcpConnector.fetch(&source, deadline).await.unwrap();
        assert_eq!(got, prefix());
        let again = TcpConnector.fetch(&source, Instant::now() + Duration::from_millis(300)).await;
        assert!(matches!(again, Err(TransferError::NotFound(_))), "{again:?}");
    }

    #[tokio::test]
    async fn failures_are_told_apart() {
        let source = producer(Duration::from_secs(3600)).await;
        let late = TcpConnector.fetch(&source, Instant::now() + Duration::from_millis(200)).await;
        assert!(matches!(late, Err(TransferError::NotFound(_) | TransferError::Timeout)), "{late:?}");
        let bad = TransferSource { key: "bad".into(), ..source.clone() };
        let refused = TcpConnector.fetch(&bad, Instant::now() + Duration::from_secs(1)).await;
        assert!(
            matches!(refused, Err(TransferError::Refused(ref m)) if m.contains("refused")),
            "{refused:?}"
        );
        // Nothing listens on a port just released.
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let closed = TransferSource { port, ..source };
        let err = TcpConnector.fetch(&closed, Instant::now() + Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), "connect");
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
        let source = TransferSource { host: "127.0.0.1".into(), port, key: "k".into() };
        let started = Instant::now();
        let err = TcpConnector.fetch(&source, Instant::now() + Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(err.kind(), "timeout");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
