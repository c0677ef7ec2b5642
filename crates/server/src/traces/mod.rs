//! OpenTelemetry traces (`--otlp-traces-endpoint`): one `llm_request` span per engine request,
//! with vLLM's attribute names, and child spans for its queue, prefill and decode phases,
//! exported over OTLP (gRPC, as vLLM's default, or HTTP/protobuf).
//!
//! A request's span is built when it ends, from the timestamps the engine recorded (arrival,
//! first step, first token, finish), so tracing adds nothing to the token path. A client's W3C
//! `traceparent` makes the span its child ([`incoming`]); without one the span starts a trace.

pub mod export;
pub mod incoming;

use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;

pub use incoming::{IncomingTrace, INCOMING_TRACE};

/// The wire protocol of the OTLP exporter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (collectors listen on port 4317).
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, `POST /v1/traces`).
    #[value(name = "http/protobuf")]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("invalid --otlp-traces-endpoint {endpoint}: {message}")]
    Endpoint { endpoint: String, message: String },
    #[error("cannot build the OTLP trace exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Where traces go (`--otlp-traces-endpoint`, `--otlp-traces-protocol`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    pub endpoint: String,
    pub protocol: OtlpProtocol,
}

impl TraceSettings {
    /// The URL the exporter posts to: a gRPC endpoint as given; an HTTP endpoint without a path
    /// gets the traces path `/v1/traces`, as OTLP's generic endpoint does.
    pub fn export_url(&self) -> Result<String, TraceError> {
        let bad = |message: &str| TraceError::Endpoint {
            endpoint: self.endpoint.clone(),
            message: message.to_owned(),
        };
        let rest = self
            .endpoint
            .strip_prefix("http://")
            .or_else(|| self.endpoint.strip_prefix("https://"))
            .ok_or_else(|| bad("expected an http:// or https:// URL"))?;
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if host.is_empty() {
            return Err(bad("the URL names no host"));
        }
        Ok(match self.protocol {
            OtlpProtocol::HttpProtobuf if path.is_empty() || path == "/" => {
                format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
            }
            _ => self.endpoint.clone(),
        })
    }
}

/// Makes and exports the requests' spans. Dropping it flushes what is queued.
#[derive(Debug)]
pub struct RequestTracer {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    export: std::sync::Mutex<Option<export::ExportTask>>,
}

/// What a span says of its request besides its timing.
#[derive(Debug, Clone)]
pub struct RequestAttributes {
    pub model: String,
    pub temperature: f32,
    pub top_p: f32,
    pub max_tokens: usize,
    pub n: usize,
    pub prompt_tokens: usize,
}

/// The span of one request in flight: its parent and attributes, finished by [`Self::finish`].
#[derive(Debug)]
pub struct RequestSpan {
    tracer: SdkTracer,
    parent: Context,
    attributes: Vec<KeyValue>,
    /// The request's arrival, on both clocks: spans carry wall-clock times, the engine's
    /// timestamps are monotonic.
    arrival: Instant,
    arrival_wall: SystemTime,
}

/// When each phase of a request began and ended.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeline {
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub finished: Instant,
    pub completion_tokens: usize,
}

impl RequestTracer {
    /// Starts the exporter on the current Tokio runtime.
    pub fn start(settings: &TraceSettings, service_name: &str) -> Result<Self, TraceError> {
        let url = settings.export_url()?;
        let timeout = Duration::from_secs(10);
        let mut exporter = match settings.protocol {
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url)
                .with_timeout(timeout)
                .build()?,
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(timeout)
                .build()?,
        };
        // The exporter sends the resource (the service's name) with every batch; the SDK's own
        // processors hand it over, ours does it here.
        let resource = Resource::builder_empty().with_service_name(service_name.to_owned()).build();
        exporter.set_resource(&resource);
        let (processor, export) = export::spawn(exporter);
        let provider =
            SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
        let tracer = provider.tracer("pagoda");
        Ok(Self { tracer, provider, export: std::sync::Mutex::new(Some(export)) })
    }

    /// A span for a request that arrived at `arrival`, a child of the client's trace when the
    /// HTTP request brought one.
    pub fn span(
        &self,
        incoming: &IncomingTrace,
        arrival: Instant,
        attributes: &RequestAttributes,
    ) -> RequestSpan {
        let wall_now = SystemTime::now();
        let arrival_wall = wall_now.checked_sub(arrival.elapsed()).unwrap_or(wall_now);
        let parent = match &incoming.parent {
            Some(remote) => Context::new().with_remote_span_context(remote.clone()),
            None => Context::new(),
        };
        let a = attributes;
        let attributes = vec![
            KeyValue::new("gen_ai.response.model", a.model.clone()),
            KeyValue::new("gen_ai.request.id", incoming.request_id.clone()),
            KeyValue::new("gen_ai.request.temperature", f64::from(a.temperature)),
            KeyValue::new("gen_ai.request.top_p", f64::from(a.top_p)),
            KeyValue::new("gen_ai.request.max_tokens", a.max_tokens as i64),
            KeyValue::new("gen_ai.request.n", a.n as i64),
            KeyValue::new("gen_ai.usage.prompt_tokens", a.prompt_tokens as i64),
        ];
        RequestSpan { tracer: self.tracer.clone(), parent, attributes, arrival, arrival_wall }
    }

    /// Exports what is queued and stops the exporter, waiting at most `timeout`; spans of
    /// requests that end later are dropped.
    pub async fn shutdown(&self, timeout: Duration) {
        // Shutting the provider down closes the processor's queue; the export task drains it.
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "trace provider shutdown");
        }
        let task = self.export.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            task.finish(timeout).await;
        }
    }
}

impl RequestSpan {
    fn wall(&self, t: Instant) -> SystemTime {
        self.arrival_wall + t.saturating_duration_since(self.arrival)
    }

    /// Ends the request's span with its phases as child spans.
    pub fn finish(self, timeline: &RequestTimeline) {
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        let mut attributes = self.attributes.clone();
        attributes.push(KeyValue::new("gen_ai.usage.completion_tokens", timeline.completion_tokens as i64));
        attributes.push(KeyValue::new("gen_ai.latency.e2e", secs(self.arrival, timeline.finished)));
        if let Some(first_token) = timeline.first_token {
            attributes
                .push(KeyValue::new("gen_ai.latency.time_to_first_token", secs(self.arrival, first_token)));
            attributes.push(KeyValue::new(
                "gen_ai.latency.time_in_model_decode",
                secs(first_token, timeline.finished),
            ));
        }
        if let Some(scheduled) = timeline.first_scheduled {
            attributes.push(KeyValue::new("gen_ai.latency.time_in_queue", secs(self.arrival, scheduled)));
            attributes.push(KeyValue::new(
                "gen_ai.latency.time_in_model_inference",
                secs(scheduled, timeline.finished),
            ));
            if let Some(first_token) = timeline.first_token {
                attributes.push(KeyValue::new(
                    "gen_ai.latency.time_in_model_prefill",
                    secs(scheduled, first_token),
                ));
            }
        }
        let request = self
            .tracer
            .span_builder("llm_request")
            .with_kind(SpanKind::Server)
            .with_start_time(self.arrival_wall)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.parent);
        let cx = Context::new().with_span(request);
        let mut phases = Vec::with_capacity(3);
        let scheduled = timeline.first_scheduled.unwrap_or(timeline.finished);
        phases.push(("queue", self.arrival, scheduled));
        if let Some(first_token) = timeline.first_token {
            phases.push(("prefill", scheduled, first_token));
            phases.push(("decode", first_token, timeline.finished));
        } else if timeline.first_scheduled.is_some() {
            phases.push(("prefill", scheduled, timeline.finished));
        }
        for (name, start, end) in phases {
            let mut span = self
                .tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .with_start_time(self.wall(start))
                .start_with_context(&self.tracer, &cx);
            span.end_with_timestamp(self.wall(end));
        }
        cx.span().end_with_timestamp(self.wall(timeline.finished));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoint: &str, protocol: OtlpProtocol) -> TraceSettings {
        TraceSettings { endpoint: endpoint.to_owned(), protocol }
    }

    #[test]
    fn http_endpoints_get_the_traces_path_when_they_have_none() {
        let http = OtlpProtocol::HttpProtobuf;
        assert_eq!(settings("http://c:4318", http).export_url().unwrap(), "http://c:4318/v1/traces");
        assert_eq!(settings("http://c:4318/", http).export_url().unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            settings("http://c:4318/otlp/v1/traces", http).export_url().unwrap(),
            "http://c:4318/otlp/v1/traces"
        );
        assert_eq!(settings("http://c:4317", OtlpProtocol::Grpc).export_url().unwrap(), "http://c:4317");
    }

    #[test]
    fn endpoints_must_be_http_urls_with_a_host() {
        for bad in ["c:4317", "grpc://c:4317", "http://", "http:///v1/traces"] {
            let e = settings(bad, OtlpProtocol::Grpc).export_url().unwrap_err();
            assert!(e.to_string().contains("--otlp-traces-endpoint"), "{bad}: {e}");
        }
    }
}
