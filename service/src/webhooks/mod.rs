//! Completion webhooks: when a run that asked for one ends (a tree's root,
//! or a later turn's; completed, failed or cancelled), its end is posted,
//! signed, to its URL; failed attempts are retried with backoff. The store
//! journals each webhook (its row is written with the tree's record, keyed
//! by the run) and each attempt's outcome, and an attempt is made under a
//! claim of that row (owner, hold, fencing epoch, as trees are claimed): so
//! a server that stops between a run's end and the
//! delivery leaves it to the next start (or another replica), which
//! delivers it once, and a delivered webhook is never sent again. A crash
//! after a receiver accepted an attempt and before the store recorded it
//! sends it again: receivers dedupe on `X-Arbor-Delivery`.

pub(crate) mod decide;
pub(crate) mod payload;

use std::sync::{Arc, Weak};
use std::time::Duration;

use arbor_actors::RunId;
use arbor_supervisor::store::{WebhookClaim, WebhookResult};
use tokio::sync::watch;

use self::decide::{Answer, Next, Retries};
use crate::Shared;

/// How often the deliverer looks for webhooks that are due (trees ended
/// elsewhere, retries whose wait is over). A tree that ends here wakes it
/// at once.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// Webhooks claimed in one look, at most.
const AT_ONCE: usize = 64;

/// How completion webhooks are sent (`[service]`'s webhook keys).
#[derive(Clone)]
pub struct WebhookOptions {
    /// The webhook of a run (a tree, a turn) started without one.
    pub default_url: Option<String>,
    /// The shared secret deliveries are signed with; without one, a start
    /// that asks for a webhook is refused, and none is sent.
    pub secret: Option<Arc<[u8]>>,
    /// Attempts, backoff and its cap.
    pub retries: Retries,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// The hosts a request's webhook may post to (`[service]
    /// webhook_hosts`); empty: any. The service's own default is trusted.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for WebhookOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookOptions")
            .field("default_url", &self.default_url)
            .field("secret", &self.secret.as_ref().map(|_| "[REDACTED]"))
            .field("retries", &self.retries)
            .field("timeout", &self.timeout)
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl Default for WebhookOptions {
    fn default() -> Self {
        let settings = arbor::config::webhooks::WebhookSettings::default();
        WebhookOptions {
            default_url: None,
            secret: None,
            retries: Retries::of(&settings),
            timeout: settings.timeout,
            hosts: Vec::new(),
        }
    }
}

impl WebhookOptions {
    /// From `[service]`'s webhook keys, with the secret read (from the
    /// environment, if it says so); `Err` says why it cannot be read.
    pub fn from_settings(
        settings: &arbor::config::webhooks::WebhookSettings,
    ) -> Result<WebhookOptions, arbor::config::webhooks::SecretError> {
        let secret = match &settings.secret {
            Some(secret) => Some(Arc::from(secret.resolve()?.into_bytes())),
            None => None,
        };
        Ok(WebhookOptions {
            default_url: settings.default_url.clone(),
            secret,
            retries: Retries::of(settings),
            timeout: settings.timeout,
            hosts: settings.hosts.clone(),
        })
    }
}

/// The webhook a start request asks for (`webhook`), or the service's
/// default; refused (422, naming `webhook`) when the service has no secret
/// to sign it with, or when its host is not one of `[service]
/// webhook_hosts` (so a caller cannot make the service post to its
/// network's inside: a metadata endpoint, an admin port). The URL itself
/// is the supervisor's to check.
pub(crate) fn asked(
    options: &WebhookOptions,
    webhook: Option<String>,
) -> Result<Option<String>, crate::ApiError> {
    if let Some(url) = &webhook
        && let Ok(parsed) = reqwest::Url::parse(url)
        && let Some(host) = parsed.host_str()
        && !arbor::config::webhooks::host_allowed(host, &options.hosts)
    {
        return Err(crate::ApiError::invalid(format!(
            "webhook: this service posts webhooks only to the hosts of [service] webhook_hosts, \
             and {host} is not one of them"
        )));
    }
    let Some(url) = webhook.or_else(|| options.default_url.clone()) else {
        return Ok(None);
    };
    if options.secret.is_none() {
        return Err(crate::ApiError::invalid(
            "webhook: this service signs every webhook and has no secret to sign with: set \
             [service] webhook_secret (a string of at least 16 bytes, or { env = \"VAR\" })",
        ));
    }
    Ok(Some(url))
}

/// Delivers due webhooks until the service shuts down: every `LOOK_EVERY`,
/// and at once when `wake` is bumped (a tree ended here).
pub(crate) async fn deliver_loop(shared: Weak<Shared>, mut wake: watch::Receiver<u64>) {
    let Some(mut shutdown) = shared.upgrade().map(|s| s.shutdown.subscribe()) else {
        return;
    };
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("arbor/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "no HTTP client for webhooks: none is delivered");
            return;
        }
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            _ = wake.changed() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.options.webhooks.secret.is_none() {
            // Nothing is sent unsigned; a start that asks is refused.
            continue;
        }
        let supervisor = shared.runtime.supervisor();
        let now = now_ms();
        let due = supervisor
            .read_store(move |store| store.webhooks_due(now, AT_ONCE))
            .await;
        let due = match due {
            Ok(due) => due,
            Err(error) => {
                tracing::warn!(%error, "cannot read the webhooks that are due");
                continue;
            }
        };
        for run in due {
            tokio::spawn(attempt(shared.clone(), client.clone(), run));
        }
    }
}

/// One attempt at the webhook of the root run `run`, if this process
/// claims it.
async fn attempt(shared: Arc<Shared>, client: reqwest::Client, run: RunId) {
    let options = &shared.options.webhooks;
    let Some(secret) = options.secret.clone() else {
        return;
    };
    let supervisor = shared.runtime.supervisor();
    let now = now_ms();
    // Held for the attempt and a second more; once that and the store's
    // lease have run out, anyone's (this process's own loop too, should the
    // outcome never be recorded).
    let hold = now + options.timeout.as_millis() as u64 + 1_000;
    let id = run.clone();
    let claim = match supervisor
        .read_store(move |store| store.claim_webhook(&id, now, hold))
        .await
    {
        Ok(Some(claim)) => claim,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(run = %run, %error, "cannot claim the run's webhook");
            return;
        }
    };
    let attempt = claim.attempts + 1;
    // The output modes of the catalog the tree ran on (its own config's).
    let tree = run.tree().clone();
    let catalog = supervisor
        .read_store(move |store| Ok(store.tree(&tree)?.0.config))
        .await
        .and_then(|config| supervisor.catalog_for(config.as_ref()));
    let id = run.clone();
    let body = match catalog {
        Ok(catalog) => {
            supervisor
                .read_store(move |store| {
                    payload::read(store, &id, |agent| {
                        catalog.template(agent).map(|t| t.output_mode)
                    })
                })
                .await
        }
        Err(error) => Err(error),
    }
    .and_then(|payload| {
        serde_json::to_vec(&payload)
            .map_err(|e| arbor_supervisor::Error::Store(format!("webhook body: {e}")))
    });
    let answer = match body {
        Ok(body) => post(&client, &claim, &secret, body, attempt, options.timeout).await,
        // The run cannot be read now: counted as an attempt, retried.
        Err(error) => Answer::Unreachable(format!("cannot read the ended run: {error}")),
    };
    let next = decide::after_attempt(&answer, attempt, &options.retries);
    let now = now_ms();
    let metrics = &shared.replica;
    let result = match next {
        Next::Delivered => {
            metrics.webhooks_delivered.inc();
            // The receiver's host only: a webhook URL often holds its
            // credential in its path or query (Slack's, Discord's).
            tracing::info!(run = %run, attempt, host = receiver_host(&claim.url), "webhook delivered");
            WebhookResult::Delivered
        }
        Next::Retry { after, error } => {
            metrics.webhook_attempts_failed.inc();
            tracing::warn!(run = %run, attempt, %error, retry_in = ?after, "webhook attempt failed");
            WebhookResult::Retry {
                error,
                next_ms: now + after.as_millis() as u64,
            }
        }
        Next::GiveUp { error } => {
            metrics.webhook_attempts_failed.inc();
            metrics.webhooks_failed.inc();
            tracing::error!(run = %run, attempt, %error, "webhook given up on");
            WebhookResult::Failed { error }
        }
    };
    let wait = match &result {
        WebhookResult::Retry { next_ms, .. } => Some(next_ms.saturating_sub(now)),
        _ => None,
    };
    match supervisor
        .read_store(move |store| store.webhook_attempted(&claim, &result, now))
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::warn!(run = %run, "another process claimed the webhook since"),
        Err(error) => tracing::error!(run = %run, %error, "cannot record the webhook attempt"),
    }
    // The retry is looked for when its wait is over, not a look later.
    if let Some(wait) = wait {
        let wake = Arc::downgrade(&shared);
        drop(shared);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            if let Some(shared) = wake.upgrade() {
                shared.webhook_wake.send_modify(|n| *n += 1);
            }
        });
    }
}

/// The host (and port) a webhook URL posts to, for logs and errors: never
/// its path or query, where a receiver's credential often is.
fn receiver_host(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_owned();
            Some(match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "(an unreadable URL)".to_owned())
}

/// Milliseconds since the Unix epoch, as the store keeps time.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Posts `body`, signed, to the claimed webhook's URL within `timeout`.
async fn post(
    client: &reqwest::Client,
    claim: &WebhookClaim,
    secret: &[u8],
    body: Vec<u8>,
    attempt: u32,
    timeout: Duration,
) -> Answer {
    let timestamp = (now_ms() / 1000).to_string();
    let signature = payload::signature(secret, &timestamp, &body);
    let request = client
        .post(&claim.url)
        .timeout(timeout)
        .header("content-type", "application/json")
        .header("x-arbor-delivery", claim.run_id.to_string())
        .header("x-arbor-attempt", attempt.to_string())
        .header("x-arbor-timestamp", &timestamp)
        .header("x-arbor-signature", signature)
        .body(body);
    match request.send().await {
        Ok(response) => {
            // Seconds or an HTTP date, as the model providers read it.
            let retry_after = arbor::providers::retry_after(response.headers());
            Answer::Status {
                code: response.status().as_u16(),
                retry_after,
            }
        }
        // Without the URL (reqwest names it), which may hold a credential:
        // the error is stored with the webhook and logged.
        Err(error) if error.is_builder() => {
            Answer::Unsendable(format!("cannot send: {}", error.without_url()))
        }
        Err(error) if error.is_timeout() => {
            Answer::Unreachable(format!("no answer within {timeout:?}"))
        }
        Err(error) => Answer::Unreachable(format!(
            "cannot reach the receiver at {}: {}",
            receiver_host(&claim.url),
            error.without_url()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::receiver_host;

    /// What is logged of a webhook URL: its host and port, never the path
    /// or query a receiver's credential is in.
    #[test]
    fn a_receivers_credential_in_its_url_is_not_what_is_logged() {
        assert_eq!(
            receiver_host("https://hooks.slack.com/services/T000/B000/XXXXSECRET"),
            "hooks.slack.com"
        );
        assert_eq!(
            receiver_host("http://127.0.0.1:8080/hook?token=SECRET"),
            "127.0.0.1:8080"
        );
        assert_eq!(receiver_host("not a url"), "(an unreadable URL)");
    }
}
