//! Traces to an OpenTelemetry collector (OTLP over HTTP, protobuf): the
//! `tracing` spans Arbor already has (`agent` with its run id, parent and type;
//! `step`; `tool`; the service's `request`) become OTLP spans.
//!
//! A tree is one trace: each agent's span (`invoke_agent {type}`) is a child
//! of its parent agent's, the root's of its tree's span; model calls are
//! `chat {gen_ai.request.model}` client spans, tools `execute_tool {tool}` (the
//! OpenTelemetry GenAI conventions; docs/telemetry.md). A W3C `traceparent`
//! is taken from a request ([`continue_trace`]) and sent with every model
//! request ([`inject_traceparent`]).
//!
//! Sent by the SDK's batch processor from a thread of its own, through a
//! blocking client built on the reqwest the providers use (no second HTTP
//! stack). An attribute recorded twice on a span (the catalog's model name,
//! then the model id an HTTP provider sends) is exported once, with its
//! last value.
//!
//! JSON log lines written inside a traced span carry its `trace_id` and
//! `span_id` ([`WithTraceIds`]), so a log line leads to its trace.

use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, SpanData, SpanProcessor, Tracer,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{FilterFn, Filtered, filter_fn};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::Error;

/// An OTLP trace exporter. Keep it until the process ends, then call
/// [`shutdown`](Otlp::shutdown) so the last spans are sent.
pub struct Otlp {
    provider: SdkTracerProvider,
}

#[derive(Debug)]
struct Blocking(reqwest::blocking::Client);

#[async_trait::async_trait]
impl HttpClient for Blocking {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut reply = Response::builder().status(status).body(response.bytes()?)?;
        *reply.headers_mut() = headers;
        Ok(reply)
    }
}

impl Otlp {
    /// Exports to `endpoint`, the collector's full traces URL
    /// (`http://HOST:4318/v1/traces`), as `service_name`.
    pub fn new(endpoint: &str, service_name: &str) -> Result<Otlp, Error> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Service(format!("OTLP client: {e}")))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Blocking(client))
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Service(format!("OTLP exporter for {endpoint}: {e}")))?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(LastValueWins(BatchSpanProcessor::builder(exporter).build()))
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name.to_owned())
                    .build(),
            )
            .build();
        Ok(Otlp { provider })
    }

    /// The `tracing` layer that hands spans to the exporter: Arbor's spans,
    /// not ractor's own (`Actor`, one per actor start and message loop, each
    /// outside the tree's trace).
    #[allow(clippy::type_complexity)]
    pub fn layer<S>(
        &self,
    ) -> Filtered<
        tracing_opentelemetry::OpenTelemetryLayer<S, Tracer>,
        FilterFn<fn(&tracing::Metadata<'_>) -> bool>,
        S,
    >
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let not_ractor: fn(&tracing::Metadata<'_>) -> bool =
            |meta| !meta.target().starts_with("ractor");
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("arbor"))
            .with_filter(filter_fn(not_ractor))
    }

    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("OTLP exporter: {error}");
        }
    }
}

/// A span processor that keeps one value per attribute key, the last
/// recorded, before the spans go to `P` (OTLP wants unique keys; the SDK
/// appends every value it is given).
#[derive(Debug)]
struct LastValueWins<P>(P);

impl<P: SpanProcessor> SpanProcessor for LastValueWins<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        last_values(&mut span.attributes);
        self.0.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// Drops every attribute that a later one with the same key replaces,
/// keeping the order of the rest.
fn last_values(attributes: &mut Vec<opentelemetry::KeyValue>) {
    let mut seen = std::collections::HashSet::new();
    let mut keep: Vec<bool> = attributes
        .iter()
        .rev()
        .map(|kv| seen.insert(kv.key.clone()))
        .collect();
    keep.reverse();
    let mut keep = keep.into_iter();
    attributes.retain(|_| keep.next().unwrap_or(true));
}

/// A log line format that adds the OpenTelemetry `trace_id` and `span_id`
/// of the span an event is in (its nearest span the exporter traces) to
/// each JSON line of the format it wraps (`tracing_subscriber`'s
/// `.json()`). A line outside any traced span is written unchanged.
pub struct WithTraceIds<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    N: for<'writer> FormatFields<'writer> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let ids = ctx.event_scope().and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let extensions = span.extensions();
                let data = extensions.get::<tracing_opentelemetry::OtelData>()?;
                Some((data.trace_id()?, data.span_id()?))
            })
        });
        let Some((trace_id, span_id)) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.trim_end();
        match body.strip_suffix('}') {
            // `{...}` → `{..., "trace_id": "…", "span_id": "…"}`
            Some(open) => {
                let comma = if open.trim_end().ends_with('{') {
                    ""
                } else {
                    ","
                };
                writeln!(
                    writer,
                    "{open}{comma}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
                )
            }
            // Not a JSON object: left as it is.
            None => writer.write_str(&line),
        }
    }
}

/// Makes `span` continue the trace of the W3C `traceparent` (and
/// `tracestate`) in `headers`, when there is a valid one; its OTLP parent is
/// then the caller's span. Nothing without the OpenTelemetry layer.
pub fn continue_trace(span: &tracing::Span, headers: &reqwest::header::HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        // A span the layer does not see (no exporter) has nothing to set.
        let _ = span.set_parent(cx);
    }
}

/// Adds the current span's W3C `traceparent` (and `tracestate`) to
/// `headers`, when the span is in a trace (the OpenTelemetry layer is on).
pub fn inject_traceparent(headers: &mut reqwest::header::HeaderMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new()
            .inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::KeyValue;

    #[test]
    fn a_key_recorded_twice_keeps_its_last_value_in_place() {
        let mut attributes = vec![
            KeyValue::new("gen_ai.request.model", "fast"),
            KeyValue::new("step", 1),
            KeyValue::new("gen_ai.request.model", "gpt-4o-mini"),
            KeyValue::new("arbor.model", "fast"),
        ];
        last_values(&mut attributes);
        assert_eq!(
            attributes,
            vec![
                KeyValue::new("step", 1),
                KeyValue::new("gen_ai.request.model", "gpt-4o-mini"),
                KeyValue::new("arbor.model", "fast"),
            ]
        );
    }
}
