//! Real model providers over HTTP: the OpenAI Chat Completions API (which also
//! fronts vLLM, Ollama, llama.cpp, LiteLLM and OpenRouter through `base_url`),
//! the OpenAI Responses API (`api = "responses"`) and the Anthropic Messages
//! API, behind the core's `Model` port.
//!
//! One client core serves every wire format: a limiter per endpoint and key, retries with
//! backoff and jitter, connect/request/stream-idle timeouts, SSE streaming with
//! deltas surfaced as events, usage and cost. A wire format (a `WireFormat`:
//! endpoint, headers, request body, reply parse, stream assembler) lives in its
//! own module, and `wire_format` is the one place that maps a
//! [`ProviderKind`] (and its [`Api`]) to it. API keys live in [`ApiKey`] and
//! never reach logs, events, errors or stored state. The client tells
//! [`observe_requests`] observers when a request is really sent and when its
//! first streamed token comes (the service's metrics count and time them),
//! and an installed [`RequestTracer`] about each request's trace context.

#![deny(missing_docs)]

mod anthropic;
mod client;
#[cfg(test)]
mod fixtures;
mod limiter;
mod observe;
mod openai;
mod responses;
mod retry;
mod settings;
mod wire;

use std::sync::Arc;

pub use client::{ClientError, HttpModel};
pub use limiter::{Limiter, LimiterConfig};
pub use observe::{
    RequestEvent, RequestObserver, RequestSignal, RequestTracer, observe_requests, trace_requests,
};
pub use retry::{RetryPolicy, retry_after};
pub use settings::{
    Api, ApiKey, HttpSection, OnTruncatedSection, Pricing, ProviderKind, ProviderSettings, Timeouts,
};

/// The wire format a provider kind speaks through one of its APIs (an
/// anthropic model has one; its `api` is refused when a config is read).
fn wire_format(kind: ProviderKind, api: Api) -> Arc<dyn wire::WireFormat> {
    match (kind, api) {
        (ProviderKind::OpenAi, Api::Chat) => Arc::new(openai::OpenAi),
        (ProviderKind::OpenAi, Api::Responses) => Arc::new(responses::Responses),
        (ProviderKind::Anthropic, _) => Arc::new(anthropic::Anthropic),
    }
}

impl HttpModel {
    /// A model speaking the wire format of `settings.kind` and `settings.api`.
    pub fn new(name: impl Into<String>, settings: ProviderSettings) -> Result<Self, ClientError> {
        let format = wire_format(settings.kind, settings.api);
        HttpModel::with_format(name, settings, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_maps_to_the_format_of_its_name() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            assert_eq!(wire_format(kind, Api::Chat).kind().name(), kind.name());
        }
    }

    #[test]
    fn an_openai_model_with_api_responses_posts_to_responses() {
        let chat = wire_format(ProviderKind::OpenAi, Api::Chat);
        let responses = wire_format(ProviderKind::OpenAi, Api::Responses);
        assert_eq!(chat.path(), "/chat/completions");
        assert_eq!(responses.path(), "/responses");
        assert_eq!(responses.kind(), ProviderKind::OpenAi);
    }
}
