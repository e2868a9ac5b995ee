//! Issue 34 (13): Codebuff's spellings of a template are accepted, and what
//! Codebuff refuses is refused: `tools` may list every built-in (each offered
//! by its own rule), `inherit_parent_system_prompt` beside a `system_prompt`
//! is an error, and a child that inherits its parent's toolbox is offered
//! only the tools it can use.

use arbor::Config;
use arbor::actors::AgentStatus;
use arbor::providers::ProviderKind;
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_test_support::run_request;
use arbor_test_support::spawn_call;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, MODEL_ID, guarded, wire};
use crate::{arbor, text};

fn check(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("codebuff.toml");
    std::fs::write(&file, config).unwrap();
    arbor(&["check-config", file.to_str().unwrap()])
}

const MODELS: &str = "[models.sim]\nprovider = \"simulated\"\n\n";

#[test]
fn tools_listing_set_output_end_turn_and_spawn_agents_are_accepted_as_codebuff_writes_them() {
    let out = check(&format!(
        "{MODELS}[agents.lead]\nmodel = \"sim\"\noutput_mode = \"structured_output\"\n\
         tools = [\"set_output\", \"end_turn\", \"spawn_agents\", \"spawn_agent_inline\"]\n\
         spawnable_agents = [\"worker\"]\n\n\
         [agents.worker]\nmodel = \"sim\"\ntools = [\"set_output\", \"end_turn\"]\n"
    ));
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // A spawn tool with nothing to spawn would do nothing: said, not ignored.
    let out = check(&format!(
        "{MODELS}[agents.lead]\nmodel = \"sim\"\ntools = [\"spawn_agents\"]\n"
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("lists spawn_agents but has no spawnable_agents"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unknown_tool_is_refused_with_every_built_in_named() {
    let out = check(&format!(
        "{MODELS}[agents.lead]\nmodel = \"sim\"\ntools = [\"set_outptu\"]\n"
    ));
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    for builtin in [
        "add_message",
        "set_messages",
        "set_output",
        "end_turn",
        "spawn_agents",
        "spawn_agent_inline",
        "spawn_agents_async",
    ] {
        assert!(said.contains(builtin), "{builtin} not named: {said}");
    }
}

#[test]
fn inherit_parent_system_prompt_beside_a_system_prompt_is_refused_not_silently_dropped() {
    let out = check(&format!(
        "{MODELS}[agents.lead]\nmodel = \"sim\"\nspawnable_agents = [\"heir\"]\n\n\
         [agents.heir]\nmodel = \"sim\"\ninherit_parent_system_prompt = true\n\
         system_prompt = \"You check facts.\"\n"
    ));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let said = text(&out.stderr);
    assert!(
        said.contains("agents.heir.inherit_parent_system_prompt") && said.contains("system_prompt"),
        "{said}"
    );
}

/// The names of the tools a Chat Completions request offers.
fn tool_names(body: &Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_child_that_inherits_its_parents_toolbox_is_not_offered_spawn_tools_that_refuse_every_call()
 {
    guarded(async {
        let kind = ProviderKind::OpenAi;
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(support::path(kind)))
            .respond_with(ResponseTemplate::new(200).set_body_json(wire::text_json(kind, "ok")))
            .mount(&server)
            .await;
        let dir = tempfile::tempdir().unwrap();
        let script = json!({"replies": [{"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("heir", "check it")])]},
            {"text": "done"}
        ]}]});
        std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
        let config = format!(
            "[models.script]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n\
             [models.m]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"{MODEL_ID}\"\n\
             stream = false\nretry = {{ max_retries = 0 }}\n\n\
             [agents.lead]\nmodel = \"script\"\nsystem_prompt = \"You lead.\"\n\
             tools = [\"add_message\"]\nspawnable_agents = [\"heir\"]\n\n\
             [agents.heir]\nmodel = \"m\"\ninherit_parent_system_prompt = true\n",
            support::base_url(kind, &server.uri())
        );
        let config = Config::parse(&config, "heir.toml", dir.path().to_path_buf()).unwrap();
        let supervisor = Supervisor::new(config.catalog().unwrap(), config.limits.clone());
        let start = StartRequest {
            agent: "lead".into(),
            prompt: "go".into(),
            ..StartRequest::default()
        };
        let (result, _) = run_request(&supervisor, start, support::GUARD).await;
        assert_eq!(result.state.status, AgentStatus::Completed);
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 1, "the heir's one request");
        let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
        // The parent's system prompt and its own tools, but no spawn tool:
        // the heir may spawn nothing, so every spawn call would be refused.
        assert!(body.to_string().contains("You lead."), "{body:#}");
        assert_eq!(
            tool_names(&body),
            vec!["add_message", "end_turn", "set_output"],
            "{body:#}"
        );
    })
    .await;
}
