//! Agent-shaped load on a real endpoint: the tree's shape comes from the
//! simulated model (which decides the spawns), every answer comes from the
//! endpoint, with the agent's real, growing history. A reply that reports no
//! usage gets estimated counts (`Usage::estimated`), marked as estimates.
//! Each request to the endpoint is timed and its outcome counted
//! ([`EndpointStats`]); the steps planned locally are not requests.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor_actors::Delta;
use arbor_actors::sync::LockExt;

use super::collect::error_kind;
use super::endpoint::EndpointStats;

use arbor_actors::models::SimulatedModel;
use arbor_actors::{DeltaSink, Model, ModelError, ModelRequest, ModelResponse, Usage, UsageSource};
use async_trait::async_trait;

/// A model that plans like the simulated one (it decides whether a step
/// spawns children, and how many) and answers like the endpoint: every
/// answer is the endpoint's reply to the agent's real history (sent
/// without the tool list).
pub(crate) struct ShapedModel {
    shape: SimulatedModel,
    endpoint: Arc<dyn Model>,
    stats: Arc<EndpointStats>,
}

impl ShapedModel {
    /// Plans with `shape` (give it zero latency: the endpoint's is the one
    /// measured) and answers with `endpoint`, recording each of its
    /// requests in `stats`.
    pub(crate) fn new(
        shape: SimulatedModel,
        endpoint: Arc<dyn Model>,
        stats: Arc<EndpointStats>,
    ) -> Self {
        ShapedModel {
            shape,
            endpoint,
            stats,
        }
    }
}

#[async_trait]
impl Model for ShapedModel {
    fn name(&self) -> &str {
        self.endpoint.name()
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        // The simulated model decides whether this step spawns (it answers at once
        // with zero latency); only answers go to the endpoint.
        let planned = self
            .shape
            .complete(request.clone(), Arc::new(|_| {}))
            .await?;
        if planned.message.tool_calls().next().is_some() {
            return Ok(planned);
        }
        let mut real = request;
        real.tools = Default::default();
        // Each HTTP request is timed: the client retries a failed one itself
        // and says so with a `Retry` delta, which ends that request (counted
        // as failed, by the kind its reason names) and starts the next after
        // the delay.
        let attempt = Arc::new(Mutex::new(Instant::now()));
        let sink: DeltaSink = {
            let (attempt, stats) = (attempt.clone(), self.stats.clone());
            Arc::new(move |delta| {
                if let Delta::Retry {
                    delay_ms, reason, ..
                } = &delta
                {
                    let mut at = attempt.locked();
                    stats.record_retried(*at, error_kind(reason));
                    *at = Instant::now() + Duration::from_millis(*delay_ms);
                }
                deltas(delta);
            })
        };
        let outcome = self.endpoint.complete(real.clone(), sink).await;
        let start = *attempt.locked();
        self.stats.record(start, &outcome);
        let mut response = outcome?;
        if response.usage.source == UsageSource::Absent {
            response.usage = Usage::estimated(&real, &response.message);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_actors::RequestMeta;
    use arbor_actors::message::Message;
    use arbor_actors::models::SimulatedConfig;

    /// An endpoint that answers with a fixed text and the usage it is given.
    struct Fixed(Usage);

    #[async_trait]
    impl Model for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        async fn complete(
            &self,
            _: ModelRequest,
            _: DeltaSink,
        ) -> Result<ModelResponse, ModelError> {
            Ok(ModelResponse {
                message: Message::assistant_text("forty bytes of answer text, give or take"),
                usage: self.0,
            })
        }
    }

    async fn answer(usage: Usage) -> Usage {
        let shape = SimulatedModel::new(
            "plan",
            SimulatedConfig {
                shape: vec![],
                ..SimulatedConfig::default()
            },
        );
        let model = ShapedModel::new(shape, Arc::new(Fixed(usage)), Arc::default());
        let request = ModelRequest {
            system_prompt: "".into(),
            messages: [Message::user("a prompt of some thirty-odd bytes")]
                .into_iter()
                .collect(),
            tools: Default::default(),
            meta: RequestMeta::default(),
        };
        model
            .complete(request, Arc::new(|_| {}))
            .await
            .unwrap()
            .usage
    }

    #[tokio::test]
    async fn an_answer_without_usage_gets_estimated_counts_marked_as_estimates() {
        let usage = answer(Usage {
            source: UsageSource::Absent,
            ..Usage::default()
        })
        .await;
        assert_eq!(usage.source, UsageSource::Estimated);
        // ⌈40 bytes / 4⌉ + 4 a message; ⌈33 bytes / 4⌉ + 4.
        assert_eq!(usage.output_tokens, 14);
        assert_eq!(usage.input_tokens, 13);
        // Reported counts, zeros included, are left as they are.
        let reported = Usage::default();
        assert_eq!(answer(reported).await, reported);
    }
}
