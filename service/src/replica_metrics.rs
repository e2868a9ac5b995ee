//! `/metrics` families of one replica among several on a shared store: the
//! trees it owns now, the trees it adopted, the controls (cancel, approvals,
//! steering, budgets) it forwarded to another replica or applied for one,
//! the event streams that follow a tree run elsewhere, and the trees it lost
//! to a fence (another replica claimed them after it); and the completion
//! webhooks it delivered, retried and gave up on. Kept apart from the
//! agents' families (`metrics.rs`): `render` gives OpenMetrics text that the
//! `/metrics` handler puts before the agents' `# EOF`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The replica's counters; cheap to bump from any task.
pub(crate) struct ReplicaMetrics {
    registry: Registry,
    /// Trees this replica runs now.
    pub(crate) owned: Gauge,
    /// Interrupted trees this replica claimed and resumed (at start or later).
    pub(crate) adoptions: Counter,
    /// Controls posted for a tree another replica owns.
    pub(crate) forwarded: Counter,
    /// Controls another replica posted, applied here (to a tree run here).
    pub(crate) applied: Counter,
    /// Controls taken here that could not be applied (the run had ended,
    /// the call was decided already, the control was malformed).
    pub(crate) refused: Counter,
    /// Trees stopped here because another replica claimed them since (the
    /// store refused this replica's writes for them).
    pub(crate) fenced: Counter,
    /// Event streams open now that follow a tree run by another replica.
    pub(crate) remote_streams: Gauge,
    /// The completion webhooks' families (`arbor_webhook_*`).
    webhook_registry: Registry,
    /// Webhooks a receiver accepted.
    pub(crate) webhooks_delivered: Counter,
    /// Webhook attempts that failed (each one, retried or not).
    pub(crate) webhook_attempts_failed: Counter,
    /// Webhooks given up on (a final refusal, or no attempt left).
    pub(crate) webhooks_failed: Counter,
}

impl ReplicaMetrics {
    pub(crate) fn new() -> ReplicaMetrics {
        let mut registry = Registry::with_prefix("arbor_replica");
        let metrics = ReplicaMetrics {
            owned: Gauge::default(),
            adoptions: Counter::default(),
            forwarded: Counter::default(),
            applied: Counter::default(),
            refused: Counter::default(),
            fenced: Counter::default(),
            remote_streams: Gauge::default(),
            registry: Registry::default(),
            webhook_registry: Registry::default(),
            webhooks_delivered: Counter::default(),
            webhook_attempts_failed: Counter::default(),
            webhooks_failed: Counter::default(),
        };
        let mut webhook_registry = Registry::with_prefix("arbor_webhook");
        webhook_registry.register(
            "deliveries",
            "Completion webhooks a receiver accepted (a 2xx answer)",
            metrics.webhooks_delivered.clone(),
        );
        webhook_registry.register(
            "attempts_failed",
            "Completion webhook attempts that failed (retried or not)",
            metrics.webhook_attempts_failed.clone(),
        );
        webhook_registry.register(
            "failures",
            "Completion webhooks given up on (refused for good, or every attempt failed)",
            metrics.webhooks_failed.clone(),
        );
        registry.register(
            "trees_owned",
            "Trees this replica runs now",
            metrics.owned.clone(),
        );
        registry.register(
            "adoptions",
            "Interrupted trees this replica claimed and resumed",
            metrics.adoptions.clone(),
        );
        registry.register(
            "controls_forwarded",
            "Controls (cancel, approval, steering, budget) posted for a tree another replica owns",
            metrics.forwarded.clone(),
        );
        registry.register(
            "controls_applied",
            "Controls another replica posted, applied to a tree run here",
            metrics.applied.clone(),
        );
        registry.register(
            "controls_refused",
            "Controls taken here that could not be applied (the run had ended, or the control was malformed)",
            metrics.refused.clone(),
        );
        registry.register(
            "fenced_trees",
            "Trees stopped here because another replica claimed them since (their writes were refused)",
            metrics.fenced.clone(),
        );
        registry.register(
            "remote_streams",
            "Event streams open now that follow a tree run by another replica",
            metrics.remote_streams.clone(),
        );
        ReplicaMetrics {
            registry,
            webhook_registry,
            ..metrics
        }
    }

    /// The families as OpenMetrics text, without the closing `# EOF`.
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        for registry in [&self.registry, &self.webhook_registry] {
            let mut out = String::new();
            // Writing to a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut out, registry);
            text.push_str(out.strip_suffix("# EOF\n").unwrap_or(&out));
        }
        text
    }

    /// `agents` (OpenMetrics text ending in `# EOF`) with these families
    /// added before its end.
    pub(crate) fn append_to(&self, agents: String) -> String {
        let mine = self.render();
        match agents.strip_suffix("# EOF\n") {
            Some(body) => format!("{body}{mine}# EOF\n"),
            None => format!("{agents}{mine}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicaMetrics;

    #[test]
    fn the_replica_families_go_before_the_end_of_the_agents_text() {
        let metrics = ReplicaMetrics::new();
        metrics.adoptions.inc();
        metrics.owned.set(3);
        let text =
            metrics.append_to("# HELP x_total X.\n# TYPE x counter\nx_total 1\n# EOF\n".into());
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.contains("arbor_replica_adoptions_total 1\n"), "{text}");
        assert!(text.contains("arbor_replica_trees_owned 3\n"), "{text}");
        assert!(
            text.contains("# TYPE arbor_replica_fenced_trees counter"),
            "{text}"
        );
        assert!(text.starts_with("# HELP x_total"), "{text}");
        metrics.webhooks_delivered.inc();
        let text = metrics.append_to("# EOF\n".into());
        assert!(
            text.contains("arbor_webhook_deliveries_total 1\n"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }
}
