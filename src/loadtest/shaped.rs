//! Agent-shaped load on a real endpoint: the tree's shape comes from the
//! simulated model (which decides the spawns), every answer comes from the
//! endpoint, with the agent's real, growing history.

use std::sync::Arc;

use arbor_actors::models::SimulatedModel;
use arbor_actors::{DeltaSink, Model, ModelError, ModelRequest, ModelResponse};
use async_trait::async_trait;

pub struct ShapedModel {
    shape: SimulatedModel,
    endpoint: Arc<dyn Model>,
}

impl ShapedModel {
    pub fn new(shape: SimulatedModel, endpoint: Arc<dyn Model>) -> Self {
        ShapedModel { shape, endpoint }
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
        self.endpoint.complete(real, deltas).await
    }
}
