//! Placeholders that only a tree can fill: what a template's prompts say
//! about where and when the tree runs (Codebuff's `{CODEBUFF_PROJECT_ROOT}`,
//! its file tree, its git changes, ...). The catalog's [`PromptContext`]
//! gives their values once per tree, when it starts (from its workspace,
//! its first start time and its prompt, so a resume and a replay on the
//! same files fill them the same); each template the tree runs is expanded
//! with them when it is first used there.

use std::path::PathBuf;
use std::sync::Arc;

use arbor_actors::AgentTemplate;
use async_trait::async_trait;

/// What a [`PromptContext`] fills placeholders from.
#[derive(Clone, Debug)]
pub struct PromptScene {
    /// The tree's workspace (its root), if it has one.
    pub workspace: Option<PathBuf>,
    /// When the tree first started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The root's prompt.
    pub prompt: String,
}

/// Fills the placeholders of a catalog's prompts that depend on the tree.
#[async_trait]
pub trait PromptContext: Send + Sync {
    /// Whether `text` holds a placeholder this context fills.
    fn wanted(&self, text: &str) -> bool;

    /// Each placeholder as written (`{CODEBUFF_PROJECT_ROOT}`) and its value
    /// for a tree in `scene`. Runs once per tree, off the agents' path; may
    /// read files and run commands.
    async fn values(&self, scene: PromptScene) -> Vec<(String, String)>;
}

/// The values of one tree's placeholders.
pub(crate) type Values = Arc<Vec<(String, String)>>;

/// Whether `template` uses a placeholder `context` fills.
pub(crate) fn wanted(context: &dyn PromptContext, template: &AgentTemplate) -> bool {
    texts(template).any(|t| context.wanted(t))
}

fn texts(template: &AgentTemplate) -> impl Iterator<Item = &str> {
    [
        Some(&*template.system_prompt),
        template.instructions_prompt.as_deref(),
        template.step_prompt.as_deref(),
    ]
    .into_iter()
    .flatten()
}

/// `template` with `values` filled in its prompts; `None` when none of them
/// holds one.
pub(crate) fn expand(
    template: &AgentTemplate,
    values: &[(String, String)],
) -> Option<AgentTemplate> {
    let holds = |text: &str| values.iter().any(|(key, _)| text.contains(key.as_str()));
    if !texts(template).any(holds) {
        return None;
    }
    let fill = |text: &str| -> Arc<str> { Arc::from(fill_once(text, values)) };
    let mut expanded = template.clone();
    expanded.system_prompt = fill(&template.system_prompt);
    expanded.instructions_prompt = template.instructions_prompt.as_deref().map(fill);
    expanded.step_prompt = template.step_prompt.as_deref().map(fill);
    Some(expanded)
}

/// `text` with each placeholder of `values` replaced, in one pass: what a
/// value brings in (a prompt, a diff that quotes a placeholder) is never
/// searched again, so the result is at most the text plus one value per
/// placeholder it held.
fn fill_once(text: &str, values: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        // The earliest placeholder left, if any.
        let next = values
            .iter()
            .filter_map(|(key, value)| rest.find(key.as_str()).map(|at| (at, key, value)))
            .min_by_key(|(at, key, _)| (*at, std::cmp::Reverse(key.len())));
        let Some((at, key, value)) = next else {
            out.push_str(rest);
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + key.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_is_filled_and_a_template_without_placeholders_is_left_alone() {
        let values = vec![
            ("{CODEBUFF_PROJECT_ROOT}".to_owned(), "/src/app".to_owned()),
            (
                "{CODEBUFF_CURRENT_DATE}".to_owned(),
                "2026-12-07".to_owned(),
            ),
        ];
        let mut template = AgentTemplate::new("a", "m");
        assert!(expand(&template, &values).is_none());
        template.system_prompt = Arc::from("Root: {CODEBUFF_PROJECT_ROOT}.");
        template.instructions_prompt = Some(Arc::from("Today is {CODEBUFF_CURRENT_DATE}."));
        template.step_prompt = Some(Arc::from("{CODEBUFF_PROJECT_ROOT} {CODEBUFF_OTHER}"));
        let expanded = expand(&template, &values).unwrap();
        assert_eq!(&*expanded.system_prompt, "Root: /src/app.");
        assert_eq!(
            expanded.instructions_prompt.as_deref(),
            Some("Today is 2026-12-07.")
        );
        assert_eq!(
            expanded.step_prompt.as_deref(),
            Some("/src/app {CODEBUFF_OTHER}")
        );
    }

    /// The symptom: a value holding placeholders (a prompt quoting them
    /// thousands of times) was searched again for each later placeholder,
    /// so a 100 KB prompt grew the system prompt to hundreds of MB. A value
    /// is put in as it is.
    #[test]
    fn a_value_that_holds_placeholders_is_not_expanded_again() {
        let prompt = "{CODEBUFF_B}".repeat(1000);
        let values = vec![
            ("{CODEBUFF_A}".to_owned(), prompt.clone()),
            ("{CODEBUFF_B}".to_owned(), "x".repeat(1000)),
        ];
        let out = fill_once("{CODEBUFF_A} and {CODEBUFF_B}", &values);
        assert_eq!(out, format!("{prompt} and {}", "x".repeat(1000)));
    }
}
