// The live page's budget notice for a tree paused on a budget, in headless Chromium.
//
//   node tests/browser/page_budget.mjs <baseUrl> <token> <treeId>
//
// <treeId> is a tree whose root is paused on a budget (on_budget = "pause"). Opens the page
// on it, waits for the "Paused on its budget" notice and reports what its raise form is set
// to. Every wait is bounded (playwright's timeouts). Prints one JSON line with what it saw.
// Exits 1 with a message on stderr (and the page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId] = process.argv.slice(2);
if (!baseArg || !token || !treeId) {
  process.stderr.write('usage: node page_budget.mjs <baseUrl> <token> <treeId>\n');
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
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`console: ${msg.text()}`); });
  page.on('pageerror', (err) => consoleErrors.push(`pageerror: ${err.message}`));

  stage = `opening the page on tree ${treeId}`;
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}&tree=${encodeURIComponent(treeId)}`, { waitUntil: 'domcontentloaded' });

  stage = 'waiting for the "Paused on its budget" notice';
  await page.waitForSelector('#budget', { state: 'visible' });
  await page.waitForFunction(() => document.querySelectorAll('#budget-list li').length === 1);
  const report = await page.evaluate(() => ({
    budget: document.querySelector('#budget-list li').dataset.budget,
    kind: document.querySelector('#budget-kind').value,
    amount: document.querySelector('#budget-amount').value,
  }));
  report.consoleErrors = consoleErrors;
  process.stdout.write(JSON.stringify(report) + '\n');
}

main()
  .then(() => browser.close())
  .catch(async (err) => {
    process.stderr.write(`page_budget: ${stage}: ${err.message}\n${consoleErrors.join('\n')}\n`);
    if (browser) await browser.close().catch(() => {});
    process.exit(1);
  });
