// Drives the live tree page of `arbor serve` in headless Chromium.
//
//   node tests/browser/live_page.mjs <baseUrl> <token> <screenshotPath> <expectedNodeCount>
//
// Starts a run from the page's form, waits for the tree's event stream to end, checks
// that the tree shows <expectedNodeCount> nodes all in a final status, opens the root
// node's details, saves a full-page screenshot, and prints one JSON line:
//   {"nodes":N,"statuses":{"completed":N,...},"screenshot":"<path>"}
// Exits 1 with a message on stderr (and the page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium), ARBOR_PROMPT (the prompt typed),
// ARBOR_AGENT (agent id to pick; default: the page's default choice).

import { chromium } from 'playwright-core';

const FINAL = new Set(['completed', 'failed', 'cancelled']);
const STREAM_TIMEOUT_MS = 60_000;
const STEP_TIMEOUT_MS = 15_000;

function usage(message) {
  process.stderr.write(`${message}\nusage: node live_page.mjs <baseUrl> <token> <screenshotPath> <expectedNodeCount>\n`);
  process.exit(1);
}

const [baseArg, token, screenshotPath, expectedArg] = process.argv.slice(2);
if (!baseArg || !token || !screenshotPath || expectedArg === undefined) usage('missing arguments');
const expected = Number(expectedArg);
if (!Number.isInteger(expected) || expected < 1) usage(`expectedNodeCount must be a positive integer, got ${expectedArg}`);
const baseUrl = baseArg.replace(/\/+$/, '');
const prompt = process.env.ARBOR_PROMPT || 'Live page check: plan, split and summarise the work';

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
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`pageerror: ${err.message}`));
  page.on('requestfailed', (req) => {
    const failure = req.failure();
    // A stream the page aborts on purpose is not an error.
    if (failure && !/ERR_ABORTED/.test(failure.errorText)) consoleErrors.push(`requestfailed: ${req.method()} ${req.url()} ${failure.errorText}`);
  });

  stage = 'opening the page';
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}`, { waitUntil: 'domcontentloaded' });

  stage = 'waiting for the agent list (GET /v1/agents)';
  await page.waitForFunction(() => document.querySelectorAll('#agent option').length > 0 || !document.querySelector('#token-gate').hidden);
  if (await page.locator('#token-gate').isVisible()) throw new Error(`the page asks for a token: ${await page.locator('#token-msg').textContent()}`);
  const hash = await page.evaluate(() => location.hash);
  if (hash.includes('token=')) throw new Error(`the token stays in the URL: ${hash}`);
  if (process.env.ARBOR_AGENT) await page.selectOption('#agent', process.env.ARBOR_AGENT);

  stage = 'starting a run from the form';
  await page.fill('#prompt', prompt);
  const started = page.waitForResponse((r) => r.request().method() === 'POST' && new URL(r.url()).pathname.endsWith('/v1/runs'));
  await page.click('#start');
  const startRes = await started;
  if (startRes.status() !== 201) throw new Error(`POST /v1/runs answered ${startRes.status()}: ${await startRes.text()}`);
  const { treeId, runId } = await startRes.json();

  stage = `waiting for the event stream of ${runId} to end (body[data-stream-done=true])`;
  await page.waitForFunction(() => document.body.dataset.streamDone === 'true', null, { timeout: STREAM_TIMEOUT_MS });

  stage = 'checking the tree';
  const nodes = await page.$$eval('#tree [data-run-id]', (els) => els.map((el) => ({ runId: el.dataset.runId, status: el.dataset.status })));
  const statuses = {};
  for (const n of nodes) statuses[n.status] = (statuses[n.status] || 0) + 1;
  if (nodes.length !== expected) {
    throw new Error(`expected ${expected} nodes in #tree, found ${nodes.length}: ${JSON.stringify(statuses)}`);
  }
  const unfinished = nodes.filter((n) => !FINAL.has(n.status));
  if (unfinished.length) {
    throw new Error(`nodes without a final status after the stream ended: ${unfinished.map((n) => `${n.runId}=${n.status}`).join(', ')}`);
  }
  const ids = new Set(nodes.map((n) => n.runId));
  if (ids.size !== nodes.length) throw new Error('a run id appears on more than one node');
  if (!ids.has(runId)) throw new Error(`the root run ${runId} is not in the tree`);
  stage = `waiting for tree ${treeId} in the run list`;
  await page.locator(`#runs [data-tree-id="${treeId}"]`).waitFor();

  stage = `opening the details of the root node ${runId}`;
  const rootRow = page.locator(`#tree > [data-run-id="${runId.replace(/["\\]/g, '\\$&')}"] > .row`);
  if ((await rootRow.count()) !== 1) throw new Error(`the root run ${runId} is not a top-level node of #tree`);
  await rootRow.click();
  await page.waitForFunction(() => {
    const bodies = document.querySelectorAll('#details .msg .body');
    return [...bodies].some((b) => b.textContent.trim().length > 0);
  });
  const detailsText = await page.locator('#details').innerText();
  if (!detailsText.includes(prompt)) process.stderr.write('note: the typed prompt does not appear verbatim in the root details\n');

  stage = `writing the screenshot to ${screenshotPath}`;
  await page.screenshot({ path: screenshotPath, fullPage: true });

  process.stdout.write(JSON.stringify({ nodes: nodes.length, statuses, screenshot: screenshotPath }) + '\n');
}

let code = 0;
try {
  await main();
} catch (err) {
  code = 1;
  process.stderr.write(`live_page: failed while ${stage}: ${err && err.message ? err.message : err}\n`);
  if (consoleErrors.length) process.stderr.write(`page console errors:\n  ${consoleErrors.join('\n  ')}\n`);
  else process.stderr.write('page console errors: none\n');
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
