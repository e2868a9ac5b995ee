// Steering, a budget raise and a follow-up turn, from the live page, in headless Chromium.
//
//   node tests/browser/page_turns.mjs <baseUrl> <token> <treeId> <steerText> <turnPrompt>
//
// <treeId> is a one-turn tree whose root is paused on its step budget (on_budget = "pause").
// Opens the page on it and waits for the "Paused on its budget" notice; sends the root a
// message through its row's "say" form and waits for the `steered` event to show it under
// the row; raises the budget by 5 steps with the notice's form and waits for the notice to
// go and the turn to complete; then starts turn 2 with the follow-up form (multitask
// "reject") and waits for the page to show both turns as sections, turn 2 with its result.
// Every wait is bounded (playwright's timeouts). Prints one JSON line with what it saw.
// Exits 1 with a message on stderr (and the page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium), ARBOR_SHOT (a screenshot of the
// two turns), ARBOR_SHOT_PAUSED (one of the paused tree, once steered).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId, steerText, turnPrompt] = process.argv.slice(2);
if (!baseArg || !token || !treeId || !steerText || !turnPrompt) {
  process.stderr.write('usage: node page_turns.mjs <baseUrl> <token> <treeId> <steerText> <turnPrompt>\n');
  process.exit(1);
}
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
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`pageerror: ${err.message}`));
  // Matches a request (or a response's request) by method and path end.
  const api = (method, suffix) => (r) => {
    const req = typeof r.request === 'function' ? r.request() : r;
    return req.method() === method && new URL(req.url()).pathname.endsWith(suffix);
  };
  const report = {};

  stage = `opening the page on tree ${treeId}`;
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}&tree=${encodeURIComponent(treeId)}`, { waitUntil: 'domcontentloaded' });

  stage = 'waiting for the "Paused on its budget" notice';
  await page.waitForSelector('#budget', { state: 'visible' });
  await page.waitForFunction(() => document.querySelectorAll('#budget-list li').length === 1);
  await page.waitForFunction(() => !!document.querySelector('#tree > .node > .row .badge.paused:not([hidden])'));
  report.paused = await page.evaluate(() => {
    const li = document.querySelector('#budget-list li');
    const root = document.querySelector('#tree > .node');
    return {
      heading: document.querySelector('#budget h2').textContent.trim(),
      item: li.textContent,
      budget: li.dataset.budget,
      runId: li.dataset.runId,
      kind: document.querySelector('#budget-kind').value,
      amount: document.querySelector('#budget-amount').value,
      rootRunId: root.dataset.runId,
      rootStatus: root.dataset.status,
      badge: root.querySelector(':scope > .row .badge.paused').textContent,
      sections: document.querySelectorAll('#tree section.turn').length,
    };
  });

  stage = 'steering the root through its row\'s "say" form';
  const root = page.locator('#tree > .node').first();
  await root.locator(':scope > .row .node-say').click();
  const say = root.locator(':scope > .say-form');
  await say.waitFor({ state: 'visible' });
  await say.locator('.say-input').fill(steerText);
  const steerRequest = page.waitForRequest(api('POST', '/messages'));
  const steerResponse = page.waitForResponse(api('POST', '/messages'));
  await say.locator('.say-send').click();
  report.steerRequest = {
    path: new URL((await steerRequest).url()).pathname,
    body: JSON.parse((await steerRequest).postData()),
    status: (await steerResponse).status(),
  };
  stage = 'waiting for the steered event to show the message under the row';
  await page.waitForFunction(() => document.querySelectorAll('#tree > .node > .steers li').length === 1);
  report.steered = await page.evaluate(() => {
    const li = document.querySelector('#tree > .node > .steers li');
    return {
      text: li.querySelector('.steer-text').textContent,
      line: li.textContent,
      elements: document.querySelectorAll('#tree img, #tree script, #tree b').length,
      xss: window.__xss || null,
      inputAfter: document.querySelector('#tree > .node > .say-form .say-input').value,
    };
  });
  if (process.env.ARBOR_SHOT_PAUSED) await page.screenshot({ path: process.env.ARBOR_SHOT_PAUSED, fullPage: true });

  stage = 'raising the step budget with the notice\'s form';
  await page.fill('#budget-amount', '5');
  const patchRequest = page.waitForRequest(api('PATCH', '/limits'));
  const patchResponse = page.waitForResponse(api('PATCH', '/limits'));
  await page.click('#budget-raise');
  report.raise = {
    body: JSON.parse((await patchRequest).postData()),
    status: (await patchResponse).status(),
    answer: await (await patchResponse).json(),
  };
  stage = 'waiting for the notice to go and turn 1 to complete';
  await page.waitForSelector('#budget', { state: 'hidden' });
  await page.waitForFunction(() => {
    const r = document.querySelector('#tree > .node');
    return r && r.dataset.status === 'completed' && document.body.dataset.streamDone === 'true';
  });
  report.afterRaise = await page.evaluate(() => ({
    pausedBadges: [...document.querySelectorAll('#tree .badge.paused')].filter((b) => !b.hidden).length,
    steers: document.querySelectorAll('#tree .steers li').length,
    sayButtonShown: getComputedStyle(document.querySelector('#tree > .node > .row .node-say')).visibility,
  }));

  stage = 'starting turn 2 with the follow-up form';
  await page.waitForSelector('#turn-form', { state: 'visible' });
  report.turnButton = (await page.locator('#turn-start').textContent()).trim();
  await page.fill('#turn-prompt', turnPrompt);
  await page.selectOption('#turn-multitask', 'reject');
  const turnRequest = page.waitForRequest(api('POST', '/turns'));
  const turnResponse = page.waitForResponse(api('POST', '/turns'));
  await page.click('#turn-start');
  const turnRes = await turnResponse;
  report.turnRequest = {
    path: new URL((await turnRequest).url()).pathname,
    body: JSON.parse((await turnRequest).postData()),
    status: turnRes.status(),
    answer: await turnRes.json(),
  };

  stage = 'waiting for the page to follow turn 2 to its result';
  await page.waitForFunction((runId) => {
    const t = document.querySelector('#tree section.turn[data-turn="2"]');
    const n = t && t.querySelector(`.node[data-run-id="${CSS.escape(runId)}"]`);
    return n && n.dataset.status === 'completed' && t.querySelector('.turn-result').textContent !== ''
      && document.body.dataset.streamDone === 'true';
  }, report.turnRequest.answer.runId);
  await page.waitForFunction(() => document.querySelector('#tree section.turn[data-turn="1"] .turn-result').textContent !== '');
  if (process.env.ARBOR_SHOT) await page.screenshot({ path: process.env.ARBOR_SHOT, fullPage: true });
  report.turns = await page.evaluate(() => ({
    sections: [...document.querySelectorAll('#tree > section.turn')].map((s) => ({
      turn: s.dataset.turn,
      label: s.querySelector('.turn-label').textContent,
      status: s.dataset.status,
      prompt: s.querySelector('.turn-prompt').textContent,
      result: s.querySelector('.turn-result').textContent,
      roots: [...s.querySelectorAll(':scope > .turn-body > .node')].map((n) => n.dataset.runId),
      nodes: s.querySelectorAll('.node').length,
    })),
    topLevelNodes: document.querySelectorAll('#tree > .node').length,
    steersInTurn1: [...document.querySelectorAll('#tree section.turn[data-turn="1"] .steers .steer-text')].map((e) => e.textContent),
    elements: document.querySelectorAll('#tree img, #tree script, #tree b, #tree i').length,
    xss: window.__xss || null,
    hashTree: new URLSearchParams(location.hash.slice(1)).get('tree'),
    turnButton: document.querySelector('#turn-start').textContent.trim(),
    formShown: !document.querySelector('#turn-form').hidden,
  }));
  report.consoleErrors = consoleErrors;
  process.stdout.write(JSON.stringify(report) + '\n');
}

let code = 0;
try {
  await main();
} catch (err) {
  code = 1;
  process.stderr.write(`page_turns: failed while ${stage}: ${err && err.message ? err.message : err}\n`);
  process.stderr.write(`page console errors: ${consoleErrors.length ? consoleErrors.join('\n  ') : 'none'}\n`);
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
