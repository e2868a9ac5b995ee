//! Traces to an OpenTelemetry collector (OTLP over HTTP, protobuf): the
//! `tracing` spans Arbor already has (`agent` with its run id, parent and type;
//! `step`; `tool`; the service's `request`) become OTLP spans.
//!
//! Sent by the SDK's batch processor from a thread of its own, through a
//! blocking client built on the reqwest the providers use (no second HTTP
//! stack).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
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
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name.to_owned())
                    .build(),
            )
            .build();
        Ok(Otlp { provider })
    }

    /// The `tracing` layer that hands spans to the exporter.
    pub fn layer<S>(&self) -> tracing_opentelemetry::OpenTelemetryLayer<S, Tracer>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("arbor"))
    }

    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("OTLP exporter: {error}");
        }
    }
}
