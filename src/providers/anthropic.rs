//! The Anthropic Messages wire format, both ways.

use arbor_actors::{DeltaSink, ModelRequest};
use serde_json::{Value, json};

use super::client::{Assembler, Failure, Reply};
use super::settings::ProviderSettings;

pub(crate) fn request_body(settings: &ProviderSettings, _request: &ModelRequest) -> Value {
    json!({"model": settings.model})
}

pub(crate) fn parse_response(_body: &Value) -> Result<Reply, Failure> {
    Err(Failure::Malformed("not yet".into()))
}

#[derive(Default)]
pub(crate) struct StreamState;

impl Assembler for StreamState {
    fn event(&mut self, _event: &str, _data: &str, _sink: &DeltaSink) -> Result<bool, Failure> {
        Err(Failure::Malformed("not yet".into()))
    }

    fn finish(self: Box<Self>) -> Result<Reply, Failure> {
        Err(Failure::Malformed("not yet".into()))
    }
}
