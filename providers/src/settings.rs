//! What configures a provider: the `[models.NAME]` table of an HTTP model and
//! the settings built from it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use arbor_actors::model::ModelOptions;
use arbor_actors::template::Structured;

use super::limiter::LimiterConfig;
use super::retry::RetryPolicy;

/// Anthropic's `max_tokens` when a model sets none (the API requires one).
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The API an HTTP model speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (and the servers compatible with it).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl ProviderKind {
    /// The provider's name: its `provider` value in a config, and how errors show it.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// How `auto` templates give their structured output on this
    /// provider's models when the model does not say: natively on OpenAI's
    /// APIs and the servers compatible with them (`response_format` /
    /// `text.format`), with `set_output` on Anthropic (only its newer models
    /// have `output_config.format`, and the rest refuse it).
    pub fn structured_default(self) -> Structured {
        match self {
            ProviderKind::OpenAi => Structured::Native,
            ProviderKind::Anthropic => Structured::Tool,
        }
    }

    /// The base URL used when a config gives none.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com",
        }
    }
}

/// Which of OpenAI's APIs an `openai` model speaks (`api = "chat"` or
/// `"responses"`; an `anthropic` model has only the Messages API).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Chat Completions (`POST /chat/completions`), which compatible servers
    /// speak too: the default.
    #[default]
    Chat,
    /// The Responses API (`POST /responses`), whose reasoning items are sent
    /// back on the next request (docs/responses.md).
    Responses,
}

impl Api {
    /// Its `api` value in a config.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Responses => "responses",
        }
    }
}

/// The range of `max_tokens` and `on_truncated.max_tokens`.
const MAX_TOKENS: (u32, u32) = (1, 10_000_000);

/// `[models.NAME]` with `provider = "openai"` or `"anthropic"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// The API's base URL (OpenAI: up to `/v1`; Anthropic: the host).
    pub base_url: Option<String>,
    /// The model id the API knows, e.g. `gpt-4o-mini` or `claude-sonnet-4-5`.
    pub model: String,
    /// `openai` only: Chat Completions (`"chat"`, the default) or the
    /// Responses API (`"responses"`).
    #[serde(default)]
    pub api: Option<Api>,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Whether replies are streamed (server-sent events).
    #[serde(default = "default_stream")]
    pub stream: bool,
    /// Most tokens a reply may have. `openai`: sent only when set, as
    /// `max_completion_tokens` to OpenAI's own API and `max_tokens` to other
    /// servers (`max_output_tokens` with `api = "responses"`); `anthropic`:
    /// always sent, 4096 when not set, raised to the thinking budget plus
    /// this when a budget would not leave room.
    pub max_tokens: Option<u32>,
    /// `on_truncated = { max_tokens = N }`: a reply cut at the output limit
    /// is asked for once more with `max_tokens` N (more than `max_tokens`);
    /// absent, a cut reply is the model's error at once.
    #[serde(default)]
    pub on_truncated: Option<OnTruncatedSection>,
    /// What its tokens cost.
    #[serde(default)]
    pub pricing: Pricing,
    /// `limits = { ... }`: the model's limiter.
    #[serde(default)]
    pub limits: LimitsSection,
    /// `retry = { ... }`: how failed requests are retried.
    #[serde(default)]
    pub retry: RetrySection,
    /// `timeouts = { ... }` (durations).
    #[serde(default)]
    pub timeouts: TimeoutsSection,
    /// Extra request headers (e.g. OpenRouter's `HTTP-Referer`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `options = { ... }`: how every call asks (sampling, tool choice,
    /// reasoning, `extra_body`); a template's `model_options` win over them.
    #[serde(default)]
    pub options: ModelOptions,
    /// Whether requests mark cache breakpoints (Anthropic's `cache_control`
    /// on the tools, the system prompt and the history a child inherited);
    /// on by default.
    #[serde(default = "default_prompt_cache")]
    pub prompt_cache: bool,
    /// `"native"` or `"tool"`: how `structured_output` templates whose
    /// `structured` is `auto` give their output on this model (absent: the
    /// provider's default, [`ProviderKind::structured_default`]). `"tool"`
    /// also says the server cannot do native structured output, so a
    /// template asking for `native` on it is refused.
    pub structured: Option<Structured>,
}

/// `on_truncated = { ... }` of an HTTP model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnTruncatedSection {
    /// The `max_tokens` of the one retry of a reply cut at the output limit.
    pub max_tokens: u32,
}

fn default_prompt_cache() -> bool {
    true
}

fn default_stream() -> bool {
    true
}

/// Credits per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// Per million uncached input tokens.
    #[serde(default)]
    pub input: f64,
    /// Per million output tokens.
    #[serde(default)]
    pub output: f64,
    /// Per million input tokens read from the cache.
    #[serde(default)]
    pub cache_read: f64,
    /// Per million input tokens written to the cache.
    #[serde(default)]
    pub cache_write: f64,
}

impl Pricing {
    /// The cost of a call; `input` counts only uncached input tokens.
    pub fn cost(&self, input: u64, output: u64, cache_read: u64, cache_write: u64) -> f64 {
        (input as f64 * self.input
            + output as f64 * self.output
            + cache_read as f64 * self.cache_read
            + cache_write as f64 * self.cache_write)
            / 1e6
    }
}

/// `limits = { ... }` of an HTTP model (see [`LimiterConfig`]).
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Requests in flight at once.
    pub max_concurrent: Option<usize>,
    /// Requests started per minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute.
    pub tokens_per_minute: Option<u32>,
}

/// `retry = { ... }` of an HTTP model (see [`RetryPolicy`]).
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    /// Retries after the first attempt.
    pub max_retries: Option<u32>,
    /// The wait before the first retry (a duration).
    pub base_delay: Option<String>,
    /// The longest wait before a retry (a duration).
    pub max_delay: Option<String>,
}

/// `timeouts = { ... }` of an HTTP model (see [`Timeouts`]).
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSection {
    /// Connecting (a duration).
    pub connect: Option<String>,
    /// The whole request (a duration).
    pub request: Option<String>,
    /// Longest silence in a stream (a duration).
    pub idle: Option<String>,
}

/// An HTTP model's timeouts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// Connecting to the endpoint.
    pub connect: Duration,
    /// The whole request, streaming included.
    pub request: Duration,
    /// Longest silence between two chunks of a stream.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(600),
            idle: Duration::from_secs(120),
        }
    }
}

/// An API key. Its `Debug` never shows it; it is never serialised.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: String) -> Self {
        ApiKey(key)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([REDACTED])")
    }
}

/// Everything a provider needs, validated. Its `Debug` shows no secret:
/// header values and a password in `base_url` are redacted, as the key is.
#[derive(Clone)]
pub struct ProviderSettings {
    /// The API it speaks.
    pub kind: ProviderKind,
    /// Which of the provider's APIs (`Api::Chat` for an anthropic model).
    pub api: Api,
    /// The API's base URL, without a trailing `/`.
    pub base_url: String,
    /// The model id the API knows.
    pub model: String,
    /// The variable the key comes from (reported when it is missing).
    pub api_key_env: Option<String>,
    /// The key, once read (see [`ProviderSettings::read_api_key`]).
    pub api_key: Option<ApiKey>,
    /// Whether replies are streamed.
    pub stream: bool,
    /// Most tokens a reply may have. OpenAI: sent only when set, as
    /// `max_completion_tokens` to OpenAI's own API (its reasoning models
    /// refuse `max_tokens`), `max_tokens` to other servers and
    /// `max_output_tokens` on the Responses API; Anthropic: required, 4096
    /// when not set, raised to the thinking budget plus this when the budget
    /// would not leave room.
    pub max_tokens: Option<u32>,
    /// The `max_tokens` a request whose reply was cut at the output limit
    /// (`finish_reason: length`, `stop_reason: max_tokens`, an incomplete
    /// response at `max_output_tokens`) is sent again with, once, in the
    /// field `max_tokens` goes in; Anthropic keeps a thinking budget's room
    /// on top ([`ProviderSettings::from_section`] checks it exceeds
    /// `max_tokens`). `None`: a cut reply is
    /// [`ModelError::Truncated`](arbor_actors::ModelError::Truncated) at once.
    pub truncated_max_tokens: Option<u32>,
    /// What its tokens cost.
    pub pricing: Pricing,
    /// The model's limiter.
    pub limits: LimiterConfig,
    /// How failed requests are retried.
    pub retry: RetryPolicy,
    /// Its timeouts.
    pub timeouts: Timeouts,
    /// Extra request headers, name and value.
    pub headers: Vec<(String, String)>,
    /// How every call asks, under a template's own `model_options`.
    pub options: ModelOptions,
    /// Whether requests mark prompt-cache breakpoints (where the API has them).
    pub prompt_cache: bool,
}

impl fmt::Debug for ProviderSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, _)| (name.as_str(), "[REDACTED]"))
            .collect();
        f.debug_struct("ProviderSettings")
            .field("kind", &self.kind)
            .field("api", &self.api)
            .field("base_url", &redacted_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key)
            .field("stream", &self.stream)
            .field("max_tokens", &self.max_tokens)
            .field("truncated_max_tokens", &self.truncated_max_tokens)
            .field("pricing", &self.pricing)
            .field("limits", &self.limits)
            .field("retry", &self.retry)
            .field("timeouts", &self.timeouts)
            .field("headers", &headers)
            .field("options", &self.options)
            .field("prompt_cache", &self.prompt_cache)
            .finish()
    }
}

/// `url` with its password (if any) replaced by `[REDACTED]`; a URL that
/// does not parse is shown as its scheme only.
fn redacted_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // A URL with a password has a host, so this cannot fail.
            let _ = parsed.set_password(Some("[REDACTED]"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => url
            .split_once(':')
            .map_or_else(String::new, |(scheme, _)| format!("{scheme}:…")),
    }
}

impl ProviderSettings {
    /// Settings from a config table, without the key (`api_key` is `None`:
    /// [`ProviderSettings::read_api_key`] reads it when a model is built).
    /// `Err` names the key of the table that is wrong.
    pub fn from_section(kind: ProviderKind, s: &HttpSection) -> Result<Self, (String, String)> {
        let ms = Duration::from_millis(1);
        let day = Duration::from_secs(86_400);
        let duration = |key: &str, value: &Option<String>, default: Duration| match value {
            Some(v) => {
                let (min, max) = match key {
                    "retry.base_delay" => (Duration::ZERO, Duration::from_secs(600)),
                    "retry.max_delay" => (Duration::ZERO, Duration::from_secs(3600)),
                    _ => (ms, day),
                };
                arbor_actors::duration::parse(v)
                    .map_err(|e| e.to_string())
                    .and_then(|d| {
                        arbor_actors::duration::within(d, min, max).map_err(|e| e.to_string())
                    })
                    .map_err(|e| (key.to_owned(), e))
            }
            None => Ok(default),
        };
        fn range<T: PartialOrd + fmt::Display + Copy>(
            key: &str,
            value: Option<T>,
            (min, max): (T, T),
        ) -> Result<(), (String, String)> {
            match value.and_then(|v| arbor_actors::out_of_range(v, (min, max))) {
                Some(why) => Err((key.to_owned(), why)),
                None => Ok(()),
            }
        }
        if kind != ProviderKind::OpenAi
            && let Some(api) = s.api
        {
            return Err((
                "api".into(),
                format!(
                    "api = {:?} is for openai models only (chat or responses); \
                     a {} model speaks one API",
                    api.name(),
                    kind.name()
                ),
            ));
        }
        range("max_tokens", s.max_tokens, MAX_TOKENS)?;
        let truncated_max_tokens = s.on_truncated.map(|t| t.max_tokens);
        range("on_truncated.max_tokens", truncated_max_tokens, MAX_TOKENS)?;
        // The retry needs more room than the request that was cut: the
        // configured max_tokens, or the one sent when none is (Anthropic's
        // default; an openai model without it sends none, so any is more).
        let first = match kind {
            ProviderKind::Anthropic => Some(s.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
            ProviderKind::OpenAi => s.max_tokens,
        };
        if let (Some(retry), Some(first)) = (truncated_max_tokens, first)
            && retry <= first
        {
            return Err((
                "on_truncated.max_tokens".into(),
                format!(
                    "{retry} must be more than the max_tokens of the request it retries \
                     ({first}{}), or the retry is cut where the reply was",
                    if s.max_tokens.is_none() {
                        ", the default"
                    } else {
                        ""
                    }
                ),
            ));
        }
        s.options
            .check()
            .map_err(|(key, why)| (format!("options.{key}"), why))?;
        range("retry.max_retries", s.retry.max_retries, (0, 100))?;
        range(
            "limits.max_concurrent",
            s.limits.max_concurrent,
            (1, 100_000),
        )?;
        range(
            "limits.requests_per_minute",
            s.limits.requests_per_minute,
            (1, 100_000_000),
        )?;
        range(
            "limits.tokens_per_minute",
            s.limits.tokens_per_minute,
            (1, u32::MAX),
        )?;
        for (key, price) in [
            ("pricing.input", s.pricing.input),
            ("pricing.output", s.pricing.output),
            ("pricing.cache_read", s.pricing.cache_read),
            ("pricing.cache_write", s.pricing.cache_write),
        ] {
            range(key, Some(price), (0.0, 1e12))?;
        }
        let base_url = s
            .base_url
            .clone()
            .unwrap_or_else(|| kind.default_base_url().to_owned());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err((
                "base_url".into(),
                format!("{base_url:?} is not an http(s) URL"),
            ));
        }
        let retry_default = RetryPolicy::default();
        let timeouts_default = Timeouts::default();
        Ok(ProviderSettings {
            kind,
            api: s.api.unwrap_or_default(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: s.model.clone(),
            api_key_env: s.api_key_env.clone(),
            api_key: None,
            stream: s.stream,
            max_tokens: s.max_tokens,
            truncated_max_tokens,
            pricing: s.pricing,
            limits: LimiterConfig {
                max_concurrent: s.limits.max_concurrent,
                requests_per_minute: s.limits.requests_per_minute,
                tokens_per_minute: s.limits.tokens_per_minute,
            },
            retry: RetryPolicy {
                max_retries: s.retry.max_retries.unwrap_or(retry_default.max_retries),
                base_delay: duration(
                    "retry.base_delay",
                    &s.retry.base_delay,
                    retry_default.base_delay,
                )?,
                max_delay: duration(
                    "retry.max_delay",
                    &s.retry.max_delay,
                    retry_default.max_delay,
                )?,
            },
            timeouts: Timeouts {
                connect: duration(
                    "timeouts.connect",
                    &s.timeouts.connect,
                    timeouts_default.connect,
                )?,
                request: duration(
                    "timeouts.request",
                    &s.timeouts.request,
                    timeouts_default.request,
                )?,
                idle: duration("timeouts.idle", &s.timeouts.idle, timeouts_default.idle)?,
            },
            headers: s
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            options: s.options.clone(),
            prompt_cache: s.prompt_cache,
        })
    }

    /// Reads the key from `api_key_env` (none when it is unset or empty): the
    /// one place the environment is read for it.
    pub fn read_api_key(&mut self) {
        self.api_key = self
            .api_key_env
            .as_ref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|k| !k.is_empty())
            .map(ApiKey::new);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn checked(kind: ProviderKind, extra: &str) -> Result<ProviderSettings, (String, String)> {
        let section: HttpSection = toml::from_str(&format!("model = \"m\"\n{extra}")).unwrap();
        ProviderSettings::from_section(kind, &section)
    }

    #[test]
    fn on_truncated_must_give_more_room_than_the_request_it_retries() {
        use ProviderKind::{Anthropic, OpenAi};
        let room = |kind, extra| checked(kind, extra).map(|s| s.truncated_max_tokens);
        assert_eq!(room(OpenAi, ""), Ok(None));
        let larger = "max_tokens = 1024\non_truncated = { max_tokens = 8192 }";
        assert_eq!(room(OpenAi, larger), Ok(Some(8192)));
        assert_eq!(room(Anthropic, larger), Ok(Some(8192)));
        // An openai model without max_tokens sends none: any length is more.
        assert_eq!(
            room(OpenAi, "on_truncated = { max_tokens = 100 }"),
            Ok(Some(100))
        );
        let refused = [
            (
                OpenAi,
                "max_tokens = 1024\non_truncated = { max_tokens = 1024 }",
                "(1024)",
            ),
            (
                Anthropic,
                "max_tokens = 9000\non_truncated = { max_tokens = 8192 }",
                "(9000)",
            ),
            // Anthropic's default length is sent when none is set.
            (
                Anthropic,
                "on_truncated = { max_tokens = 4096 }",
                "(4096, the default)",
            ),
            (
                OpenAi,
                "on_truncated = { max_tokens = 0 }",
                "from 1 to 10000000",
            ),
            (
                OpenAi,
                "on_truncated = { max_tokens = 20000000 }",
                "out of range",
            ),
        ];
        for (kind, extra, why) in refused {
            let (key, message) = checked(kind, extra).unwrap_err();
            assert_eq!(key, "on_truncated.max_tokens", "{extra}");
            assert!(message.contains(why), "{extra}: {message}");
        }
        let unknown = toml::from_str::<HttpSection>("model = \"m\"\non_truncated = { tokens = 1 }");
        assert!(unknown.unwrap_err().to_string().contains("unknown field"));
    }

    /// Issue 33: `{:?}` of a model's settings (a trace-level log, a panic
    /// message) printed its header values and the password of its base URL.
    #[test]
    fn settings_debug_shows_no_header_value_or_url_password() {
        let extra = "base_url = \"https://user:hunter2@gw.example/v1\"\n\
                     headers = { \"X-Gateway-Key\" = \"sk-planted-42\" }";
        let settings = checked(ProviderKind::OpenAi, extra).unwrap();
        let shown = format!("{settings:?}");
        assert!(!shown.contains("sk-planted-42"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("X-Gateway-Key"), "{shown}");
        assert!(shown.contains("gw.example"), "{shown}");
        assert_eq!(redacted_url("https://u:p@[bad"), "https:…");
    }
}
