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

/// Where and how a process sends its traces: from the OpenTelemetry
/// environment variables (the OpenTelemetry specification's names) and
/// `[service] otlp_endpoint`. The environment wins over the config file, as
/// `RUST_LOG` does; a process exports only when one of them names an
/// endpoint.
///
/// - the endpoint: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full traces URL,
///   used as it is), else `OTEL_EXPORTER_OTLP_ENDPOINT` (the collector's base
///   URL, `/v1/traces` appended), else `[service] otlp_endpoint`;
/// - the protocol: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
///   `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default) is what
///   Arbor sends; `grpc` and `http/json` are refused with the reason rather
///   than sent to a collector that expects another encoding;
/// - headers: `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
///   `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key2=value2`, values
///   percent-decoded), on every export request;
/// - the timeout of an export: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else
///   `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds; 10 s);
/// - the resource's `service.name`: `OTEL_SERVICE_NAME`, else a
///   `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else `arbor` (the other
///   resource attributes of `OTEL_RESOURCE_ATTRIBUTES` are exported too);
/// - nothing is exported when `OTEL_SDK_DISABLED=true` or
///   `OTEL_TRACES_EXPORTER=none`, whatever else is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpSettings {
    /// The collector's full traces URL (`http://HOST:4318/v1/traces`).
    pub endpoint: String,
    /// What set it: the variable's name, or `[service] otlp_endpoint`.
    pub source: &'static str,
    /// The export requests' headers, decoded.
    pub headers: Vec<(String, String)>,
    /// How long one export request may take.
    pub timeout: Duration,
    /// The resource's `service.name`.
    pub service_name: String,
}

const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const CONFIG_KEY: &str = "[service] otlp_endpoint";

impl OtlpSettings {
    /// The settings this process's environment and `config_endpoint` (the
    /// config's `[service] otlp_endpoint`) give; `None`: export nothing.
    pub fn from_env(config_endpoint: Option<&str>) -> Result<Option<OtlpSettings>, Error> {
        OtlpSettings::resolve(|name| std::env::var(name).ok(), config_endpoint)
    }

    /// [`from_env`](Self::from_env) over any source of variables.
    pub fn resolve(
        var: impl Fn(&str) -> Option<String>,
        config_endpoint: Option<&str>,
    ) -> Result<Option<OtlpSettings>, Error> {
        // An empty variable is an unset one (the specification's rule).
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let bad =
            |name: &str, value: &str, why: &str| Error::Service(format!("{name}={value:?}: {why}"));
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none")) {
            return Ok(None);
        }
        let (endpoint, source) = if let Some(url) = var(TRACES_ENDPOINT) {
            (url.trim().to_owned(), TRACES_ENDPOINT)
        } else if let Some(base) = var(ENDPOINT) {
            let base = base.trim();
            let slash = if base.ends_with('/') { "" } else { "/" };
            (format!("{base}{slash}v1/traces"), ENDPOINT)
        } else if let Some(url) = config_endpoint.filter(|v| !v.trim().is_empty()) {
            (url.trim().to_owned(), CONFIG_KEY)
        } else {
            return Ok(None);
        };
        let http = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'));
        if !http || reqwest::Url::parse(&endpoint).is_err() {
            return Err(bad(
                source,
                &endpoint,
                "not an http(s) URL like http://127.0.0.1:4318 (an OTLP/HTTP collector)",
            ));
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            let Some(protocol) = var(name) else { continue };
            match protocol.trim() {
                "http/protobuf" => break,
                "grpc" => {
                    return Err(bad(
                        name,
                        &protocol,
                        "Arbor sends OTLP over HTTP only (http/protobuf): point it at the \
                         collector's OTLP/HTTP endpoint (port 4318) and set http/protobuf",
                    ));
                }
                "http/json" => {
                    return Err(bad(
                        name,
                        &protocol,
                        "Arbor sends OTLP/HTTP as protobuf only: set http/protobuf (every \
                         OTLP/HTTP collector takes it)",
                    ));
                }
                _ => {
                    return Err(bad(
                        name,
                        &protocol,
                        "not an OTLP protocol (grpc, http/protobuf, http/json); Arbor sends \
                         http/protobuf",
                    ));
                }
            }
        }
        let headers = match [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ]
        .into_iter()
        .find_map(|name| Some((name, var(name)?)))
        {
            Some((name, list)) => {
                parse_headers(&list).map_err(|why| bad(name, &list, &why.to_string()))?
            }
            None => Vec::new(),
        };
        let timeout = match [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .into_iter()
        .find_map(|name| Some((name, var(name)?)))
        {
            Some((name, ms)) => match ms.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => return Err(bad(name, &ms, "not a timeout in milliseconds (10000)")),
            },
            None => Duration::from_secs(10),
        };
        let service_name = var("OTEL_SERVICE_NAME")
            .map(|name| name.trim().to_owned())
            .or_else(|| {
                var("OTEL_RESOURCE_ATTRIBUTES")?
                    .split(',')
                    .filter_map(|pair| pair.split_once('='))
                    .find(|(key, _)| key.trim() == "service.name")
                    .map(|(_, value)| percent_decode(value.trim()).unwrap_or_default())
                    .filter(|name| !name.is_empty())
            })
            .unwrap_or_else(|| "arbor".to_owned());
        Ok(Some(OtlpSettings {
            endpoint,
            source,
            headers,
            timeout,
            service_name,
        }))
    }
}

/// What is wrong with an OTLP headers list (each names the item or key).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum BadHeaders {
    /// An item without `=`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    /// A value whose `%` escapes are broken or not UTF-8.
    #[error("the value of {0:?} is not percent-encoded UTF-8")]
    NotPercentEncoded(String),
    /// A key HTTP cannot carry as a header name.
    #[error("{0:?} is not a header name")]
    Name(String),
    /// A value HTTP cannot carry.
    #[error("the value of {0:?} is not a header value")]
    Value(String),
}

/// `key=value,key2=value2` (W3C baggage's list, values percent-encoded).
fn parse_headers(list: &str) -> Result<Vec<(String, String)>, BadHeaders> {
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| BadHeaders::NotKeyValue(item.to_owned()))?;
            let key = key.trim();
            let value = percent_decode(value.trim())
                .ok_or_else(|| BadHeaders::NotPercentEncoded(key.to_owned()))?;
            reqwest::header::HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| BadHeaders::Name(key.to_owned()))?;
            reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| BadHeaders::Value(key.to_owned()))?;
            Ok((key.to_owned(), value))
        })
        .collect()
}

/// `%XX` escapes decoded; `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The exporter of this process, for [`flush_before_exit`].
static EXPORTING: std::sync::Mutex<Option<SdkTracerProvider>> = std::sync::Mutex::new(None);

/// Sends the spans that have ended, for a path that ends the process without
/// unwinding (`std::process::exit` on a signal), which would drop them;
/// bounded (2 s), since a collector that does not answer must not hold the
/// exit. Nothing when this process exports nothing.
pub fn flush_before_exit() {
    let provider = EXPORTING.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(provider) = provider {
        let _ = provider.shutdown_with_timeout(Duration::from_secs(2));
    }
}

/// An OTLP trace exporter. Keep it until the process ends: dropping it (or
/// [`shutdown`](Otlp::shutdown)) sends the last spans.
pub struct Otlp {
    provider: SdkTracerProvider,
    stopped: std::sync::atomic::AtomicBool,
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
    /// Exports as `settings` say.
    pub fn new(settings: &OtlpSettings) -> Result<Otlp, Error> {
        let OtlpSettings {
            endpoint,
            source,
            headers,
            timeout,
            service_name,
        } = settings;
        let client = reqwest::blocking::Client::builder()
            .timeout(*timeout)
            .build()
            .map_err(|e| Error::Service(format!("OTLP client: {e}")))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Blocking(client))
            .with_endpoint(endpoint)
            .with_headers(headers.iter().cloned().collect())
            .with_timeout(*timeout)
            .build()
            .map_err(|e| Error::Service(format!("OTLP exporter for {endpoint} ({source}): {e}")))?;
        // The environment's resource attributes (OTEL_RESOURCE_ATTRIBUTES),
        // with the service's name as resolved (the SDK would let a
        // `service.name` there override OTEL_SERVICE_NAME).
        let provider = SdkTracerProvider::builder()
            .with_span_processor(LastValueWins(BatchSpanProcessor::builder(exporter).build()))
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name.clone())
                    .build(),
            )
            .build();
        *EXPORTING.lock().unwrap_or_else(|e| e.into_inner()) = Some(provider.clone());
        // Model requests carry their span's trace context, and the model
        // call's span its names.
        arbor_providers::trace_requests(Box::new(ProviderTracer));
        Ok(Otlp {
            provider,
            stopped: Default::default(),
        })
    }

    /// The exporter [`OtlpSettings::from_env`] asks for (`config_endpoint`:
    /// the config's `[service] otlp_endpoint`); `None` when nothing names an
    /// endpoint.
    pub fn from_env(config_endpoint: Option<&str>) -> Result<Option<Otlp>, Error> {
        OtlpSettings::from_env(config_endpoint)?
            .map(|settings| Otlp::new(&settings))
            .transpose()
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

    /// Sends what is buffered and stops the exporter (once).
    pub fn shutdown(&self) {
        if self.stopped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Err(error) = self.provider.shutdown() {
            eprintln!("OTLP exporter: {error}");
        }
    }
}

impl Drop for Otlp {
    fn drop(&mut self) {
        self.shutdown();
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

/// The model providers' side of the traces: the `traceparent` of each
/// request and the model call's span attributes and name.
struct ProviderTracer;

impl arbor_providers::RequestTracer for ProviderTracer {
    fn inject(&self, headers: &mut reqwest::header::HeaderMap) {
        inject_traceparent(headers);
    }

    fn set_attribute(&self, span: &tracing::Span, key: &'static str, value: String) {
        span.set_attribute(key, value);
    }

    fn rename(&self, span: &tracing::Span, name: String) {
        span.context().span().update_name(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::KeyValue;

    fn settings(
        vars: &[(&str, &str)],
        config: Option<&str>,
    ) -> Result<Option<OtlpSettings>, Error> {
        let vars: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OtlpSettings::resolve(|name| vars.get(name).cloned(), config)
    }

    #[test]
    fn the_environment_names_the_endpoint_before_the_config_key() {
        let config = Some("http://config:4318/v1/traces");
        // Nothing set: no export.
        assert_eq!(settings(&[], None).unwrap(), None);
        // The config's key alone.
        let s = settings(&[], config).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://config:4318/v1/traces");
        assert_eq!(s.source, "[service] otlp_endpoint");
        assert_eq!(s.service_name, "arbor");
        assert_eq!(s.timeout, Duration::from_secs(10));
        // The base URL gets /v1/traces (with or without its slash) and wins.
        for base in ["http://env:4318", "http://env:4318/"] {
            let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", base)], config)
                .unwrap()
                .unwrap();
            assert_eq!(s.endpoint, "http://env:4318/v1/traces");
            assert_eq!(s.source, "OTEL_EXPORTER_OTLP_ENDPOINT");
        }
        // The traces URL is taken as it is, before the base URL.
        let s = settings(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://traces:9/custom",
                ),
            ],
            config,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://traces:9/custom");
        // An empty variable is an unset one.
        let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")], config)
            .unwrap()
            .unwrap();
        assert_eq!(s.source, "[service] otlp_endpoint");
        // Switched off, whatever else is set.
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            let vars = [off, ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")];
            assert_eq!(settings(&vars, config).unwrap(), None);
        }
    }

    #[test]
    fn headers_timeout_and_service_name_follow_the_specification() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318");
        let s = settings(
            &[
                base,
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=general"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                    "authorization=Bearer%20t0k, x-team = a%2Cb",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=ci,service.name=from-attrs",
                ),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.headers,
            vec![
                ("authorization".to_owned(), "Bearer t0k".to_owned()),
                ("x-team".to_owned(), "a,b".to_owned()),
            ]
        );
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(s.service_name, "from-attrs");
        let s = settings(
            &[
                base,
                ("OTEL_SERVICE_NAME", "named"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.service_name, "named");
    }

    #[test]
    fn what_arbor_cannot_send_is_refused_naming_the_variable() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318");
        let refused = |vars: &[(&str, &str)]| settings(vars, None).unwrap_err().to_string();
        let grpc = refused(&[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert!(
            grpc.starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
            "{grpc}"
        );
        assert!(grpc.contains("http/protobuf"), "{grpc}");
        // The traces variable is read first.
        let json = refused(&[
            base,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ]);
        assert!(
            json.starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="),
            "{json}"
        );
        assert!(
            settings(
                &[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
                None
            )
            .unwrap()
            .is_some()
        );
        let url = refused(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318")]);
        assert!(
            url.starts_with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="),
            "{url}"
        );
        let headers = refused(&[base, ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]);
        assert!(headers.contains("not key=value"), "{headers}");
        let timeout = refused(&[base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]);
        assert!(
            timeout.starts_with("OTEL_EXPORTER_OTLP_TIMEOUT="),
            "{timeout}"
        );
    }

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
