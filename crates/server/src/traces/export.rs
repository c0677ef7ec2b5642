//! Batching and exporting finished spans on the server's Tokio runtime. The SDK's own batch
//! processor runs a thread of its own, where the gRPC exporter finds no runtime; here the
//! processor only queues (never blocking a request: a full queue drops the span and counts
//! it) and a task exports a batch every [`FLUSH_INTERVAL`] or [`MAX_BATCH`] spans.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Spans waiting for export beyond this are dropped (a collector that is down must not grow
/// the server's memory).
const QUEUE: usize = 4096;
const MAX_BATCH: usize = 512;
const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// The SDK side: hands each ended span to the export task.
#[derive(Debug)]
pub struct QueueProcessor {
    /// Taken at shutdown, which closes the queue: the export task then drains it and ends.
    tx: Mutex<Option<mpsc::Sender<SpanData>>>,
    dropped: AtomicU64,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let queued = match self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(tx) => tx.try_send(span).is_ok(),
            None => false,
        };
        if !queued {
            let before = self.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_power_of_two() || before == 0 {
                tracing::warn!(dropped = before + 1, "trace export queue full or closed: dropping spans");
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }
}

/// The export task; [`Self::finish`] waits for it to drain the queue.
#[derive(Debug)]
pub struct ExportTask {
    handle: JoinHandle<()>,
}

impl ExportTask {
    /// Waits until every queued span is exported (the queue closes when the processor shuts
    /// down), at most `timeout`.
    pub async fn finish(self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.handle).await.is_err() {
            tracing::warn!("trace export did not finish in {timeout:?}; unexported spans are lost");
        }
    }
}

/// A processor for the tracer provider and the task that exports what it queues.
pub fn spawn<E: SpanExporter + 'static>(exporter: E) -> (QueueProcessor, ExportTask) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let handle = tokio::spawn(run(exporter, rx));
    (QueueProcessor { tx: Mutex::new(Some(tx)), dropped: AtomicU64::new(0) }, ExportTask { handle })
}

async fn run<E: SpanExporter>(exporter: E, mut rx: mpsc::Receiver<SpanData>) {
    let mut failures = 0u64;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let spans = batch.len();
        if let Err(e) = exporter.export(batch).await {
            failures += 1;
            // One line per failure streak's powers of two: a collector that is down should not
            // flood the log.
            if failures.is_power_of_two() {
                tracing::warn!(error = %e, spans, failures, "cannot export spans to the OTLP endpoint");
            }
        } else {
            failures = 0;
        }
    }
    if let Err(e) = exporter.shutdown() {
        tracing::debug!(error = %e, "OTLP exporter shutdown");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Keeps what it is given.
    #[derive(Debug, Clone, Default)]
    struct Collect(Arc<Mutex<Vec<String>>>);

    impl SpanExporter for Collect {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch.into_iter().map(|s| s.name.to_string()));
            Ok(())
        }
    }

    #[tokio::test]
    async fn ended_spans_reach_the_exporter_and_finish_drains_them() {
        use opentelemetry::trace::{Span as _, Tracer, TracerProvider};
        let collect = Collect::default();
        let (processor, task) = spawn(collect.clone());
        let provider =
            opentelemetry_sdk::trace::SdkTracerProvider::builder().with_span_processor(processor).build();
        let tracer = provider.tracer("t");
        for name in ["a", "b", "c"] {
            tracer.start(name).end();
        }
        provider.shutdown().unwrap();
        // Spans ended after shutdown are dropped, not queued.
        tracer.start("late").end();
        task.finish(Duration::from_secs(5)).await;
        let mut names = collect.0.lock().unwrap().clone();
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
    }
}
