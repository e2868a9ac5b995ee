//! Real model providers over HTTP: the OpenAI Chat Completions API (which also
//! fronts vLLM, Ollama, llama.cpp, LiteLLM and OpenRouter through `base_url`)
//! and the Anthropic Messages API, behind the core's `Model` port.
//!
//! One client core serves every wire format: a per-model limiter, retries with
//! backoff and jitter, connect/request/stream-idle timeouts, SSE streaming with
//! deltas surfaced as events, usage and cost. A wire format (a `WireFormat`:
//! endpoint, headers, request body, reply parse, stream assembler) lives in its
//! own module, and `wire_format` is the one place that maps a
//! [`ProviderKind`] to it. API keys live in [`ApiKey`] and never reach logs,
//! events, errors or stored state.

mod anthropic;
mod client;
#[cfg(test)]
mod fixtures;
mod limiter;
mod openai;
mod retry;
mod settings;
mod wire;

use std::sync::Arc;

pub use client::HttpModel;
pub use limiter::{Limiter, LimiterConfig};
pub use retry::RetryPolicy;
pub use settings::{ApiKey, HttpSection, Pricing, ProviderKind, ProviderSettings, Timeouts};

/// The wire format a provider kind speaks.
fn wire_format(kind: ProviderKind) -> Arc<dyn wire::WireFormat> {
    match kind {
        ProviderKind::OpenAi => Arc::new(openai::OpenAi),
        ProviderKind::Anthropic => Arc::new(anthropic::Anthropic),
    }
}

impl HttpModel {
    /// A model speaking the wire format of `settings.kind`.
    pub fn new(name: impl Into<String>, settings: ProviderSettings) -> Result<Self, String> {
        let format = wire_format(settings.kind);
        HttpModel::with_format(name, settings, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_maps_to_the_format_of_its_name() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            assert_eq!(wire_format(kind).kind().name(), kind.name());
        }
    }
}
