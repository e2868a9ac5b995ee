//! The live page's "Waiting for approval" panel in a real headless Chromium
//! (Debian's, driven by playwright-core from `tests/browser`, like the live
//! page tests in `serve.rs`): a tree whose agent calls a tool that needs a
//! person's approval, decided from the page.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, Sse, TOKEN, encoded, get, post, stream};
use crate::support::browser::Browser;

/// A boss that spawns a clerk; the clerk's `echo` waits for a person. One
/// clerk (spawned) makes two calls in its first step, one of them with an
/// input that is markup; another (started on its own) makes one call.
const CONFIG: &str = r#"
[run]
agent = "boss"

[limits]
max_depth = 2
deadline = "2m"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.boss]
model = "script"
spawnable_agents = ["clerk"]

[agents.clerk]
model = "script"
tools = ["echo"]
approve = ["echo"]
"#;

/// The input that must show as text, never run or render as markup.
const MARKUP: &str = r#"<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">"#;
const REASON: &str = "not on my watch";

fn script() -> Value {
    json!({"replies": [
        {"agent": "boss", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "clerk", "prompt": "echo the tags"}
            ]}}]},
            {"text": "boss done"}
        ]},
        {"agent": "clerk", "prompt": "echo the tags", "steps": [
            {"toolCalls": [
                {"name": "echo", "input": {"word": MARKUP}},
                {"name": "echo", "input": {"word": "to be edited"}}
            ]},
            {"text": "echoed"}
        ]},
        {"agent": "clerk", "prompt": "please deny", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "rm -rf"}}]},
            {"text": "told no"}
        ]}
    ]})
}

/// Drives the page: `node - <base> <token> <treeA>` with the script on stdin.
/// Tree A (two pending calls, the page opened after they were asked for):
/// Approve the first, Edit the second (invalid JSON is refused on the page,
/// an input the schema refuses gets the server's 422 under the call, then a
/// valid input is sent); the root ends completed. Then a clerk started
/// from the page's form asks live; Deny with a reason. Prints one JSON line.
const DRIVER: &str = r#"
import { createRequire } from 'node:module';
const require = createRequire(process.env.ARBOR_BROWSER_DIR + '/package.json');
const { chromium } = require('playwright-core');

const [baseArg, token, treeA, reason] = process.argv.slice(2);
const baseUrl = baseArg.replace(/\/+$/, '');
const consoleErrors = [];
let browser;
let stage = 'launching chromium';

async function main() {
  browser = await chromium.launch({
    executablePath: process.env.ARBOR_CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  page.setDefaultTimeout(30_000);
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`pageerror: ${err.message}`));
  const items = '#approval-list li[data-call-id]';
  const count = () => page.locator(items).count();
  const report = {};

  stage = 'opening the page on tree A';
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}&tree=${encodeURIComponent(treeA)}`, { waitUntil: 'domcontentloaded' });
  stage = 'waiting for tree A\'s two pending calls in the panel';
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length === 2, items);
  await page.waitForSelector('#approvals', { state: 'visible' });
  await page.waitForFunction(() => !!document.querySelector('#tree .node > .row .badge.wait:not([hidden])'));
  if (process.env.ARBOR_SHOT) await page.screenshot({ path: process.env.ARBOR_SHOT, fullPage: true });
  report.a = await page.evaluate((sel) => {
    const lis = [...document.querySelectorAll(sel)];
    const clerk = lis[0].dataset.runId;
    const node = document.querySelector(`#tree .node[data-run-id="${CSS.escape(clerk)}"]`);
    const rootEl = document.querySelector('#tree > .node');
    const shown = (el) => !!el && !el.hidden && el.offsetParent !== null;
    return {
      heading: document.querySelector('#approvals h2').textContent.trim(),
      tools: lis.map((li) => li.querySelector('.a-tool').textContent),
      inputs: lis.map((li) => li.querySelector('.a-input pre').textContent),
      runIds: lis.map((li) => li.dataset.runId),
      ages: lis.map((li) => li.querySelector('.a-age').textContent),
      scripts: document.querySelectorAll('#approvals script, #approvals img').length,
      xss: window.__xss || null,
      clerkBadge: node ? shown(node.querySelector(':scope > .row .badge.wait')) && node.querySelector(':scope > .row .badge.wait').textContent : null,
      rootBadge: rootEl ? shown(rootEl.querySelector(':scope > .row .badge.wait')) : null,
      rootRunId: rootEl ? rootEl.dataset.runId : null,
    };
  }, items);

  stage = 'approving the first call';
  const first = page.locator(items).filter({ hasText: '<script>' });
  await first.locator('button.approve').click();
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length === 1, items);

  stage = 'editing the second call with invalid JSON';
  const second = page.locator(items).first();
  await second.locator('button.edit').click();
  report.editPrefill = await second.locator('textarea.a-edit').inputValue();
  await second.locator('textarea.a-edit').fill('{"word": ');
  await second.locator('button.edit-send').click();
  report.invalid = (await second.locator('.a-msg').textContent()).trim();
  report.stillPending = await count();

  stage = 'sending an edited input the tool\'s schema refuses';
  await second.locator('textarea.a-edit').fill('{"word": 5}');
  await second.locator('button.edit-send').click();
  await page.waitForFunction((sel) => {
    const li = document.querySelector(sel);
    return li && li.querySelector('.a-msg').textContent !== '' && !li.querySelector('button.edit-send').disabled;
  }, items);
  report.refused = (await second.locator('.a-msg').textContent()).trim();
  report.stillPendingAfterRefusal = await count();

  stage = 'approving the second call with an edited input';
  await second.locator('textarea.a-edit').fill('{"word": "edited by a person"}');
  await second.locator('button.edit-send').click();
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length === 0, items);
  report.panelHiddenAfter = await page.locator('#approvals').isHidden();

  stage = 'waiting for tree A\'s root to complete on the page';
  await page.waitForFunction(() => {
    const root = document.querySelector('#tree > .node');
    return root && root.dataset.status === 'completed' && document.body.dataset.streamDone === 'true';
  });
  report.aBadges = await page.locator('#tree .badge.wait:visible').count();

  stage = 'starting a clerk from the page';
  await page.selectOption('#agent', 'clerk');
  await page.fill('#prompt', 'please deny this one');
  await page.click('#start');
  await page.waitForFunction((a) => {
    const t = new URLSearchParams(location.hash.slice(1)).get('tree');
    return t && t !== a;
  }, treeA);
  report.treeB = new URLSearchParams((await page.evaluate(() => location.hash)).slice(1)).get('tree');

  stage = 'waiting for the clerk\'s call to show live';
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length === 1, items);
  await page.waitForFunction(() => !!document.querySelector('#tree .node > .row .badge.wait:not([hidden])'));
  report.b = await page.evaluate((sel) => {
    const li = document.querySelector(sel);
    return { tool: li.dataset.tool, input: li.querySelector('.a-input pre').textContent, runId: li.dataset.runId };
  }, items);

  stage = 'denying it with a reason';
  const only = page.locator(items).first();
  await only.locator('button.deny').click();
  await only.locator('input.a-reason').fill(reason);
  await only.locator('button.deny-send').click();
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length === 0, items);
  stage = 'waiting for tree B\'s root to complete on the page';
  await page.waitForFunction(() => {
    const root = document.querySelector('#tree > .node');
    return root && root.dataset.status === 'completed' && document.body.dataset.streamDone === 'true';
  });
  report.bBadges = await page.locator('#tree .badge.wait:visible').count();
  report.consoleErrors = consoleErrors;
  process.stdout.write(JSON.stringify(report) + '\n');
}

let code = 0;
try {
  await main();
} catch (err) {
  code = 1;
  process.stderr.write(`page_approvals: failed while ${stage}: ${err && err.message ? err.message : err}\n`);
  process.stderr.write(`page console errors: ${consoleErrors.length ? consoleErrors.join('\n  ') : 'none'}\n`);
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
"#;

/// Polls `GET /v1/trees/{tree}/approvals` until it lists `n` calls.
async fn pending(server: &Server, tree: &str, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(server, &format!("/v1/trees/{tree}/approvals")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let list = body["approvals"].as_array().cloned().unwrap_or_default();
        if list.len() == n {
            return list;
        }
        assert!(std::time::Instant::now() < deadline, "{body:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn decisions(events: &[Sse]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.event == "approvalDecided")
        .map(|e| e.data["decision"].clone())
        .collect()
}

/// In real Chromium: a tree whose clerk waits on two `echo` calls, the page
/// opened after they were asked for (so the panel comes from GET): both are
/// listed, the markup input as text, the clerk's node marked; Approve and
/// Edit (invalid JSON refused on the page, the server's 422 on a wrong
/// input shown under the call, then a valid input) let the tree
/// complete. A clerk started from the page asks live; Deny with a reason,
/// and its stream carries approvalDecided with that reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_approves_edits_and_denies_waiting_calls_in_chromium() {
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    std::fs::write(dir.path().join("script.json"), script().to_string()).unwrap();
    let driver = dir.path().join("page_approvals.mjs");
    std::fs::write(&driver, DRIVER).unwrap();
    let config = dir.path().join("config.toml");
    let mut server = Server::start(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        Some(TOKEN),
    );
    server.wait_for("ready");

    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "boss", "prompt": "get it echoed"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree_a = created["treeId"].as_str().unwrap().to_owned();
    let root_a = created["runId"].as_str().unwrap().to_owned();
    let listed = pending(&server, &tree_a, 2).await;
    assert!(
        listed
            .iter()
            .all(|a| a["tool"] == "echo" && a["runId"] != root_a),
        "{listed:?}"
    );

    // What the panel looked like, for a person to see.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-approvals.png");
    let _ = std::fs::remove_file(&shot);
    let report = browser
        .drive(
            &driver,
            &[server.base.as_str(), TOKEN, tree_a.as_str(), REASON],
            &[("ARBOR_SHOT", &shot)],
        )
        .await;

    // Tree A: both calls listed from GET, as text, the clerk's node marked.
    let a = &report["a"];
    assert_eq!(a["heading"], "Waiting for approval (2)", "{report:#}");
    assert_eq!(a["tools"], json!(["echo", "echo"]), "{report:#}");
    let inputs: Vec<&str> = a["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let shown = serde_json::to_string_pretty(&json!({"word": MARKUP})).unwrap();
    assert!(inputs.contains(&shown.as_str()), "{report:#}");
    assert_eq!(
        a["scripts"], 0,
        "markup in an input became elements: {report:#}"
    );
    assert_eq!(a["xss"], Value::Null, "{report:#}");
    assert!(
        a["ages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.as_str().unwrap().starts_with("asked ")),
        "{report:#}"
    );
    assert_eq!(a["rootRunId"], root_a.as_str(), "{report:#}");
    assert_eq!(a["clerkBadge"], "waiting for approval ×2", "{report:#}");
    assert_eq!(a["rootBadge"], false, "{report:#}");
    assert_eq!(
        report["editPrefill"],
        serde_json::to_string_pretty(&json!({"word": "to be edited"})).unwrap(),
        "{report:#}"
    );
    assert!(
        report["invalid"]
            .as_str()
            .unwrap()
            .starts_with("Not valid JSON"),
        "{report:#}"
    );
    assert_eq!(report["stillPending"], 1, "{report:#}");
    // The server's 422 shows under the call, which still waits.
    assert!(
        !report["refused"].as_str().unwrap().is_empty()
            && !report["refused"]
                .as_str()
                .unwrap()
                .starts_with("Not valid JSON"),
        "{report:#}"
    );
    assert_eq!(report["stillPendingAfterRefusal"], 1, "{report:#}");
    assert_eq!(report["panelHiddenAfter"], true, "{report:#}");
    assert_eq!(report["aBadges"], 0, "{report:#}");
    assert_eq!(report["bBadges"], 0, "{report:#}");
    // No script error; Chromium logs the refused POST (422) itself.
    assert!(
        report["consoleErrors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.as_str().unwrap().contains("status of 422")),
        "{report:#}"
    );

    // What the page decided is what the server recorded.
    let (_, tree) = get(&server, &format!("/v1/trees/{tree_a}")).await;
    assert_eq!(tree["tree"]["status"], "completed", "{tree:#}");
    let events = stream(&server, &root_a, None, |_| {}).await;
    // In the order the page sent them: Approve, then the edited input.
    assert_eq!(
        decisions(&events),
        vec![
            json!({"decision": "approve"}),
            json!({"decision": "approve", "input": {"word": "edited by a person"}}),
        ],
        "{events:#?}"
    );
    let (_, clerk) = get(
        &server,
        &format!("/v1/runs/{}", encoded(a["runIds"][0].as_str().unwrap())),
    )
    .await;
    let history = clerk["state"]["messageHistory"].to_string();
    assert!(history.contains("edited by a person"), "{clerk:#}");

    // Tree B: started from the page, asked live, denied with the reason.
    let tree_b = report["treeB"].as_str().unwrap();
    assert_eq!(report["b"]["tool"], "echo", "{report:#}");
    assert_eq!(
        report["b"]["input"],
        serde_json::to_string_pretty(&json!({"word": "rm -rf"})).unwrap(),
        "{report:#}"
    );
    let (_, tree) = get(&server, &format!("/v1/trees/{tree_b}")).await;
    assert_eq!(tree["tree"]["status"], "completed", "{tree:#}");
    let root_b = tree["tree"]["rootRunId"].as_str().unwrap().to_owned();
    assert_eq!(report["b"]["runId"], root_b.as_str(), "{report:#}");
    let events = stream(&server, &root_b, None, |_| {}).await;
    assert_eq!(
        decisions(&events),
        vec![json!({"decision": "deny", "reason": REASON})],
        "{events:#?}"
    );
    assert!(pending(&server, tree_b, 0).await.is_empty());
}
