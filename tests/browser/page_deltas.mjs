// The live page shows a running agent's reply as it streams in, in headless
// Chromium.
//
//   node tests/browser/page_deltas.mjs <baseUrl> <token> <treeId> <runId>
//
// Opens the page on the tree and waits (bounded) for the row of <runId> to
// say "writing: …" while it still runs; then for the run's end. Prints one
// JSON line: the first note seen with its row's status then, and the row's
// status and note at the end. Exits 1 with a message on stderr (and the
// page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId, runId] = process.argv.slice(2);
if (!baseArg || !token || !treeId || !runId) {
  process.stderr.write('usage: node page_deltas.mjs <baseUrl> <token> <treeId> <runId>\n');
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

  const selector = `#tree [data-run-id="${runId.replace(/["\\]/g, '\\$&')}"]`;
  stage = `waiting for ${runId} to show streamed text`;
  const seen = await page.waitForFunction((sel) => {
    const el = document.querySelector(sel);
    const note = el && el.querySelector(':scope > .row .note');
    if (!note || !note.textContent.startsWith('writing: ')) return null;
    return { note: note.textContent, status: el.dataset.status };
  }, selector, { polling: 20 }).then((h) => h.jsonValue());

  stage = `waiting for ${runId} to end`;
  const end = await page.waitForFunction((sel) => {
    const el = document.querySelector(sel);
    if (!el || el.dataset.status === 'running') return null;
    const note = el.querySelector(':scope > .row .note');
    return { status: el.dataset.status, note: note ? note.textContent : null };
  }, selector, { polling: 50 }).then((h) => h.jsonValue());

  process.stdout.write(JSON.stringify({ seen, end, consoleErrors }) + '\n');
}

main()
  .then(() => browser.close())
  .catch(async (err) => {
    process.stderr.write(`page_deltas: ${stage}: ${err.message}\n${consoleErrors.join('\n')}\n`);
    if (browser) await browser.close().catch(() => {});
    process.exit(1);
  });
