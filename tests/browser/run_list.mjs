// The run list of the live page in headless Chromium, for a tree that is running.
//
//   node tests/browser/run_list.mjs <baseUrl> <token> <treeId> <agentsFirst> <agentsThen>
//
// Opens the page (the tree is not selected: its list item is what GET /v1/runs says),
// waits for the tree's item to read "running" with <agentsFirst> agents, then (as
// more of its agents start) <agentsThen> agents; then selects the tree, cancels it
// with the page's Cancel button, and waits for the item to read "cancelled" with
// <agentsThen> agents. Prints one JSON line:
//   {"seen":["running 4 agents", ...],"first":"…","then":"…","ended":"…"}
// where `seen` is every distinct "status count" the item showed, in order.
// Exits 1 with a message on stderr (and the page's console errors) on any failure.
//
// Environment: ARBOR_CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

const [baseArg, token, treeId, firstArg, thenArg] = process.argv.slice(2);
if (!baseArg || !token || !treeId || firstArg === undefined || thenArg === undefined) {
  process.stderr.write('usage: node run_list.mjs <baseUrl> <token> <treeId> <agentsFirst> <agentsThen>\n');
  process.exit(1);
}
const [first, then] = [Number(firstArg), Number(thenArg)];
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

  // "status N agents" of the tree's item, or null while it is not listed.
  await page.addInitScript(() => {
    window.__itemText = (id) => {
      const li = [...document.querySelectorAll('#runs li')].find((el) => el.dataset.treeId === id);
      if (!li) return null;
      const count = (li.querySelector('.r3').textContent.match(/^(\d+) agents?/) || [])[1];
      return `${li.dataset.status} ${count} agents`;
    };
  });

  stage = 'opening the page';
  await page.goto(`${baseUrl}/#token=${encodeURIComponent(token)}`, { waitUntil: 'domcontentloaded' });

  // Every distinct text the item shows, as it changes.
  await page.evaluate((id) => {
    window.__seen = [];
    const note = () => {
      const t = window.__itemText(id);
      if (t && window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
    };
    new MutationObserver(note).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
    note();
  }, treeId);

  const waitFor = async (want) => {
    stage = `waiting for the run list to show tree ${treeId} as "${want}"`;
    try {
      await page.waitForFunction(({ id, want }) => window.__itemText(id) === want, { id: treeId, want });
    } catch (e) {
      const seen = await page.evaluate(() => window.__seen);
      throw new Error(`${e.message.split('\n')[0]}; the item showed ${JSON.stringify(seen)}`);
    }
    return want;
  };

  const firstText = await waitFor(`running ${first} agents`);
  const thenText = await waitFor(`running ${then} agents`);

  stage = 'selecting the tree and cancelling it from the page';
  await page.locator(`#runs li[data-tree-id="${treeId}"]`).click();
  await page.waitForFunction((n) => document.querySelectorAll('#tree [data-run-id]').length === n, then);
  await page.waitForFunction(() => !document.querySelector('#cancel').disabled);
  await page.click('#cancel');
  const endedText = await waitFor(`cancelled ${then} agents`);

  const seen = await page.evaluate(() => window.__seen);
  process.stdout.write(JSON.stringify({ seen, first: firstText, then: thenText, ended: endedText }) + '\n');
}

let code = 0;
try {
  await main();
} catch (err) {
  code = 1;
  process.stderr.write(`run_list: failed while ${stage}: ${err && err.message ? err.message : err}\n`);
  if (consoleErrors.length) process.stderr.write(`page console errors:\n  ${consoleErrors.join('\n  ')}\n`);
  else process.stderr.write('page console errors: none\n');
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
