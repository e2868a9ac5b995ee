//! `arbor approvals`, `arbor approve` and `arbor deny`: the tool calls that
//! wait for a person's decision on a running `arbor serve` (semantics §12),
//! and `arbor approve --always`, which allows a call's tool for good in its
//! tree.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::now_ms;
use super::render::clip;
use anyhow::Context;
use arbor_actors::approval::Decision;
use serde_json::Value;

use super::service::Api;

/// How much of a call's input the table shows.
const INPUT_WIDTH: usize = 48;

/// `arbor approvals [TREE]`: `GET /v1/approvals` (or a tree's), as a table
/// or as the server's JSON list.
pub(super) async fn list(api: &Api, tree_id: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let segments: Vec<&str> = match tree_id {
        Some(tree) => vec!["v1", "trees", tree, "approvals"],
        None => vec!["v1", "approvals"],
    };
    let (status, body) = api.send(reqwest::Method::GET, &segments, None).await?;
    if !status.is_success() {
        let message = api.refusal(status, &body);
        anyhow::bail!("the server refused to list the approvals ({status}): {message}");
    }
    let approvals = body["approvals"]
        .as_array()
        .with_context(|| format!("the server at {} sent no approvals list", api.server))?;
    if json {
        outln!("{}", serde_json::to_string_pretty(approvals)?)?;
    } else if approvals.is_empty() {
        let scope = tree_id.map_or_else(String::new, |t| format!(" in tree {t}"));
        eprintln!("no tool call waits for a decision{scope}");
    } else {
        out!("{}", table(approvals, now_ms()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The decision `arbor approve` sends: the model's input, or `--input`'s
/// JSON (read here, so a typo is named before the server is asked).
pub(super) fn approval(input: Option<&str>) -> anyhow::Result<Decision> {
    let input = input
        .map(|text| {
            serde_json::from_str::<Value>(text)
                .with_context(|| format!("--input is not valid JSON: {text:?}"))
        })
        .transpose()?;
    Ok(Decision::Approve { input })
}

/// `arbor approve` / `arbor deny`: posts the decision to
/// `/v1/trees/{treeId}/approvals/{callId}`; the server's refusal is the
/// command's error.
pub(super) async fn decide(
    api: &Api,
    tree_id: &str,
    call_id: &str,
    decision: Decision,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !tree_id.trim().is_empty(),
        "the tree id is empty: give the TREE column of `arbor approvals`"
    );
    anyhow::ensure!(
        !call_id.trim().is_empty(),
        "the call id is empty: give the CALL column of `arbor approvals`, or `all`"
    );
    if call_id == ALL {
        return decide_all(api, tree_id, decision).await;
    }
    let body = serde_json::to_value(&decision)?;
    let (status, answer) = api
        .send(
            reqwest::Method::POST,
            &["v1", "trees", tree_id, "approvals", call_id],
            Some(&body),
        )
        .await?;
    let verb = match decision {
        Decision::Approve { .. } => "approve",
        Decision::Deny { .. } => "deny",
    };
    if !status.is_success() {
        let message = api.refusal(status, &answer);
        anyhow::bail!(
            "cannot {verb} tool call {call_id} of tree {tree_id}: the server refused ({status}): {message}"
        );
    }
    match decision {
        Decision::Approve { input: None } => {
            outln!("approved: tool call {call_id} of tree {tree_id} runs")?;
        }
        Decision::Approve { input: Some(_) } => {
            outln!("approved: tool call {call_id} of tree {tree_id} runs with the edited input")?;
        }
        Decision::Deny { .. } => {
            outln!(
                "denied: tool call {call_id} of tree {tree_id} does not run; the model reads why"
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `arbor approve TREE CALL --always` (or `TREE all --always`): approves
/// the call (every waiting call) and always allows its tool (their tools) in
/// the tree, `{"decision": "approve", "always": true}`: the other waiting
/// calls of it are approved too, and its later calls run without asking.
pub(super) async fn approve_always(
    api: &Api,
    tree_id: &str,
    call_id: &str,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !tree_id.trim().is_empty(),
        "the tree id is empty: give the TREE column of `arbor approvals`"
    );
    anyhow::ensure!(
        !call_id.trim().is_empty(),
        "the call id is empty: give the CALL column of `arbor approvals`, or `all`"
    );
    let mut segments = vec!["v1", "trees", tree_id, "approvals"];
    if call_id != ALL {
        segments.push(call_id);
    }
    let body = serde_json::json!({"decision": "approve", "always": true});
    let (status, answer) = api
        .send(reqwest::Method::POST, &segments, Some(&body))
        .await?;
    if !status.is_success() {
        let message = api.refusal(status, &answer);
        let what = match call_id {
            ALL => "the waiting calls".to_owned(),
            call => format!("tool call {call}"),
        };
        anyhow::bail!(
            "cannot always allow the tool of {what} of tree {tree_id}: the server refused ({status}): {message}"
        );
    }
    let names = |key: &str| -> Vec<String> {
        answer[key].as_array().map_or_else(Vec::new, |list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
    };
    let n = names("approved").len().max(names("decided").len());
    let calls = if n == 1 { "call" } else { "calls" };
    let tools = names("alwaysAllowed");
    let tools = if tools.is_empty() {
        "its tool".to_owned()
    } else {
        tools.join(", ")
    };
    outln!(
        "approved: {n} tool {calls} of tree {tree_id} run; {tools} always allowed in tree {tree_id}: later calls run without asking"
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The call id `arbor approve`/`deny` take for every call of the tree
/// waiting now (`arbor approve TREE all`).
const ALL: &str = "all";

/// `arbor approve TREE all` / `arbor deny TREE all`: one decision over every
/// call of the tree waiting now (`POST /v1/trees/{treeId}/approvals`), each
/// journaled as its own.
async fn decide_all(api: &Api, tree_id: &str, decision: Decision) -> anyhow::Result<ExitCode> {
    let body = match &decision {
        Decision::Approve { input: Some(_) } => anyhow::bail!(
            "--input is one call's: approve the calls one by one (`arbor approvals {tree_id}` lists them)"
        ),
        Decision::Approve { input: None } => serde_json::json!({"decision": "approve"}),
        Decision::Deny { reason } => serde_json::json!({"decision": "deny", "reason": reason}),
    };
    let (status, answer) = api
        .send(
            reqwest::Method::POST,
            &["v1", "trees", tree_id, "approvals"],
            Some(&body),
        )
        .await?;
    let verb = match decision {
        Decision::Approve { .. } => "approve",
        Decision::Deny { .. } => "deny",
    };
    if !status.is_success() {
        let message = api.refusal(status, &answer);
        anyhow::bail!(
            "cannot {verb} the waiting calls of tree {tree_id}: the server refused ({status}): {message}"
        );
    }
    let n = answer["decided"].as_array().map_or(0, Vec::len);
    let calls = if n == 1 { "call" } else { "calls" };
    match decision {
        Decision::Approve { .. } => outln!("approved: {n} tool {calls} of tree {tree_id} run")?,
        Decision::Deny { .. } => {
            outln!("denied: {n} tool {calls} of tree {tree_id} do not run; the model reads why")?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The table of pending approvals: tree, call id, run, tool, input
/// (compact JSON, clipped), age.
fn table(approvals: &[Value], now_ms: u64) -> String {
    let text = |v: &Value, key: &str| v[key].as_str().unwrap_or("-").to_owned();
    let rows: Vec<[String; 6]> = approvals
        .iter()
        .map(|a| {
            let input = serde_json::to_string(&a["input"]).unwrap_or_default();
            let age = a["requestedMs"]
                .as_u64()
                .map_or_else(|| "-".to_owned(), |at| age(now_ms.saturating_sub(at)));
            [
                text(a, "treeId"),
                text(a, "toolCallId"),
                text(a, "runId"),
                text(a, "tool"),
                clip(&input, INPUT_WIDTH),
                age,
            ]
        })
        .collect();
    let header = ["TREE", "CALL", "RUN", "TOOL", "INPUT", "AGE"];
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header.map(str::to_owned)).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                let _ = write!(line, "{cell:>width$}");
            } else {
                let _ = write!(line, "{cell:<width$} ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// An age in its largest whole unit: 12s, 5m, 3h, 2d.
fn age(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{age, approval, table};
    use arbor_actors::approval::Decision;

    #[test]
    fn the_table_clips_the_input_and_shows_the_age() {
        let long = "x".repeat(100);
        let approvals = [json!({
            "treeId": "tabc", "runId": "tabc/0.1", "toolCallId": "call_1", "step": 2,
            "tool": "echo", "input": {"word": long}, "requestedMs": 1_000
        })];
        let shown = table(&approvals, 126_000);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 2, "{shown}");
        assert!(lines[0].starts_with("TREE "), "{shown}");
        for cell in [
            "tabc",
            "call_1",
            "tabc/0.1",
            "echo",
            "{\"word\":\"xxx",
            "…",
            "2m",
        ] {
            assert!(lines[1].contains(cell), "{cell} in {shown}");
        }
        assert!(!lines[1].contains(&long), "{shown}");
    }

    #[test]
    fn ages() {
        assert_eq!(age(59_999), "59s");
        assert_eq!(age(3_600_000), "1h");
        assert_eq!(age(2 * 86_400_000), "2d");
    }

    #[test]
    fn an_edited_input_is_read_as_json_before_the_server_is_asked() {
        assert_eq!(
            approval(Some(r#"{"word":"hi"}"#)).unwrap(),
            Decision::Approve {
                input: Some(json!({"word": "hi"}))
            }
        );
        assert_eq!(approval(None).unwrap(), Decision::Approve { input: None });
        let error = format!("{:#}", approval(Some("{word: hi}")).unwrap_err());
        assert!(error.starts_with("--input is not valid JSON"), "{error}");
    }
}
