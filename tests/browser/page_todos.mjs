// The live page's todo list and worktree in a run's details, in headless Chromium.
//
//   node tests/browser/page_todos.mjs <baseUrl> <token> <treeId> <runId>
//
// Opens the page on the tree, clicks the node of <runId> and reports the
// details' todo heading and items and its worktree line. Every wait is bounded
// (playwright's timeouts). Prints one JSON line with what it saw. Exits 1 with
// a message on stderr (and the page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId, runId] = process.argv.slice(2);
if (!baseArg || !token || !treeId || !runId) {
  process.stderr.write('usage: node page_todos.mjs <baseUrl> <token> <treeId> <runId>\n');
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

  stage = `opening the details of ${runId}`;
  const row = page.locator(`#tree [data-run-id="${runId.replace(/["\\]/g, '\\$&')}"] > .row`);
  await row.waitFor();
  await row.click();
  await page.waitForSelector('#details ul.todos li');
  const report = await page.evaluate(() => {
    const heads = [...document.querySelectorAll('#details h3')].map((e) => e.textContent);
    return {
      todoHeading: heads.find((t) => t.startsWith('Todos')) || null,
      todos: [...document.querySelectorAll('#details ul.todos li')].map((li) => ({
        status: li.dataset.status, text: li.textContent,
      })),
      worktree: (document.querySelector('#details p.worktree') || {}).textContent || null,
    };
  });
  report.consoleErrors = consoleErrors;
  process.stdout.write(JSON.stringify(report) + '\n');
}

main()
  .then(() => browser.close())
  .catch(async (err) => {
    process.stderr.write(`page_todos: ${stage}: ${err.message}\n${consoleErrors.join('\n')}\n`);
    if (browser) await browser.close().catch(() => {});
    process.exit(1);
  });
