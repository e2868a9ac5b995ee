// "Always allow TOOL" on the live page's approvals panel, in headless Chromium.
//
//   node tests/browser/page_always_allow.mjs <baseUrl> <token> <treeId> <count> <tool>
//
// <treeId> is a tree with <count> calls of <tool> waiting for a decision. Opens the page
// on it, waits for the panel to list them all, clicks the first one's "Always allow <tool>"
// and waits for the one POST (with always) and for the panel to go: the server approves the
// tool's other calls with it. Every wait is bounded (playwright's timeouts). Prints one JSON
// line with what it saw. Exits 1 with a message on stderr (and the page's console errors)
// on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId, countArg, tool] = process.argv.slice(2);
if (!baseArg || !token || !treeId || !countArg || !tool) {
  process.stderr.write('usage: node page_always_allow.mjs <baseUrl> <token> <treeId> <count> <tool>\n');
  process.exit(1);
}
const baseUrl = baseArg.replace(/\/+$/, '');
const count = Number(countArg);

const consoleErrors = [];
let browser;
let stage = 'launching chromium';

async function main() {
  browser = await chromium.launch({
    executablePath: process.env.ARBOR_CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`pageerror: ${err.message}`));
  const requests = [];
  page.on('request', (r) => {
    const path = new URL(r.url()).pathname;
    if (r.method() === 'POST' && path.includes('/approvals')) requests.push({ path, body: JSON.parse(r.postData() || 'null') });
  });

  stage = `opening the page on tree ${treeId}`;
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}&tree=${encodeURIComponent(treeId)}`, { waitUntil: 'domcontentloaded' });

  stage = `waiting for the ${count} waiting calls`;
  await page.waitForFunction((n) => document.querySelectorAll('#approval-list > *').length === n, count);
  const button = page.locator('#approval-list > li').first().locator('button.always');
  const report = { button: (await button.textContent()).trim() };

  stage = `clicking "${report.button}"`;
  const answered = page.waitForResponse((r) => r.request().method() === 'POST'
    && new URL(r.url()).pathname.startsWith(`/v1/trees/${encodeURIComponent(treeId)}/approvals/`));
  await button.click();
  const response = await answered;
  report.status = response.status();
  report.answer = await response.json();
  await page.waitForSelector('#approvals', { state: 'hidden' });
  report.left = await page.evaluate(() => document.querySelectorAll('#approval-list > *').length);
  report.requests = requests;
  report.consoleErrors = consoleErrors;
  process.stdout.write(JSON.stringify(report) + '\n');
}

main()
  .then(() => browser.close())
  .catch(async (err) => {
    process.stderr.write(`page_always_allow: ${stage}: ${err.message}\n${consoleErrors.join('\n')}\n`);
    if (browser) await browser.close().catch(() => {});
    process.exit(1);
  });
