//! Real model providers over HTTP: the OpenAI Chat Completions API (which also
//! fronts vLLM, Ollama, llama.cpp, LiteLLM and OpenRouter through `base_url`)
//! and the Anthropic Messages API, behind the core's `Model` port.
//!
//! One client core serves both wire formats: a per-model limiter, retries with
//! backoff and jitter, connect/request/stream-idle timeouts, SSE streaming with
//! deltas surfaced as events, usage and cost. API keys live in [`ApiKey`] and
//! never reach logs, events, errors or stored state.

mod anthropic;
mod client;
mod limiter;
mod openai;
mod retry;
mod settings;

pub use client::HttpModel;
pub use limiter::{Limiter, LimiterConfig};
pub use retry::RetryPolicy;
pub use settings::{ApiKey, HttpSection, Pricing, ProviderKind, ProviderSettings, Timeouts};
