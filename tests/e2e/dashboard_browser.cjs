// The browser half of e2e_dashboard_test (dashboard_test.cc): opens shoal's dashboard in
// headless Chromium through puppeteer-core, records what the page shows, and prints one
// JSON report on its last line of output. The C++ test, which started `shoal serve` and
// sends it load, makes the assertions on that report.
//
//   node dashboard_browser.cjs <chromium> <dashboard url> <http base url> <model to unload>
//        <output folder>
//
// Steps: a wide window (1280x900) until the page has drawn three samples; two snapshots of
// its charts three seconds apart; a screenshot; the model is unloaded through the HTTP
// repository API and the page watched until its card is gone; then a narrow window
// (375x800) with its overflow measured and a second screenshot.
'use strict';
const path = require('path');
const puppeteer = require('puppeteer-core');

const [chromium, url, httpBase, unloadModel, outDir] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// What the page shows now: per card, its charts and, for each, the number of points, the
// last values of each series, the value text and a digest of the drawn canvas.
function snapshot() {
  const d = window.shoalDashboard;
  const cards = {};
  for (const card of document.querySelectorAll('section.card[data-model]')) {
    const key = `${card.dataset.model}/${card.dataset.version}`;
    const charts = {};
    for (const chart of card.querySelectorAll('.chart')) {
      const name = chart.dataset.chart;
      const c = d.charts.get(`${key}/${name}`);
      const canvas = chart.querySelector('canvas');
      let digest = null;
      if (canvas) {
        // A cheap digest of the pixels: changes whenever the drawing does.
        const url = canvas.toDataURL('image/png');
        let h = 0;
        for (let i = 0; i < url.length; i++) h = (h * 31 + url.charCodeAt(i)) | 0;
        digest = `${url.length}:${h}`;
      }
      const series = {};
      if (c) {
        for (const [s, ys] of c.ys) series[s] = ys.filter((v) => v !== null);
      }
      charts[name] = {
        points: c ? c.xs.length : 0,
        last_x: c && c.xs.length ? c.xs[c.xs.length - 1] : null,
        series,
        value: chart.querySelector('.chart-value').textContent,
        canvas: digest,
        note: chart.querySelector('.plot .note') ? chart.querySelector('.plot .note').textContent
          : null,
      };
    }
    cards[key] = { charts, badges: [...card.querySelectorAll('.badge')].map((b) => b.textContent) };
  }
  return { seq: d.seq, updates: d.updates, cards, status: document.getElementById('status').dataset.state };
}

// How far anything reaches past the right edge of the viewport, in CSS pixels.
function overflow() {
  let right = 0;
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width > 0) right = Math.max(right, r.right);
  }
  return {
    inner_width: window.innerWidth,
    scroll_width: document.documentElement.scrollWidth,
    body_scroll_width: document.body.scrollWidth,
    max_right: right,
  };
}

async function main() {
  const report = { errors: [] };
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // As root in a container Chromium needs --no-sandbox; --headless=new is the full
    // browser without a window.
    args: ['--no-sandbox', '--headless=new', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  try {
    const page = await browser.newPage();
    page.on('pageerror', (e) => report.errors.push(`pageerror: ${e.message}`));
    page.on('console', (m) => {
      if (m.type() === 'error') report.errors.push(`console: ${m.text()}`);
    });
    page.on('requestfailed', (r) => report.errors.push(`requestfailed: ${r.url()}`));
    // Content-Security-Policy violations (the page must load nothing from elsewhere).
    await page.evaluateOnNewDocument(() => {
      document.addEventListener('securitypolicyviolation', (e) => {
        console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`);
      });
    });
    await page.setViewport({ width: 1280, height: 900 });
    await page.goto(url, { waitUntil: 'load', timeout: 20000 });
    await page.waitForFunction(
      () => window.shoalDashboard && window.shoalDashboard.updates >= 3 &&
        document.querySelectorAll('section.card[data-model]').length >= 2,
      { timeout: 20000, polling: 100 });
    report.before = await page.evaluate(snapshot);
    await sleep(3000);
    report.after = await page.evaluate(snapshot);
    report.wide_overflow = await page.evaluate(overflow);
    report.wide_screenshot = path.join(outDir, 'dashboard-wide.png');
    await page.screenshot({ path: report.wide_screenshot, fullPage: true });

    const r = await fetch(`${httpBase}/v2/repository/models/${unloadModel}/unload`,
      { method: 'POST', body: '{}' });
    report.unload_status = r.status;
    const t0 = Date.now();
    try {
      await page.waitForFunction(
        (m) => !document.querySelector(`section.card[data-model="${m}"]`),
        { timeout: 10000, polling: 100 }, unloadModel);
      report.unload_seen_ms = Date.now() - t0;
    } catch (e) {
      report.unload_seen_ms = null;
    }
    report.after_unload = await page.evaluate(snapshot);

    await page.setViewport({ width: 375, height: 800 });
    const updates = report.after_unload.updates;
    await page.waitForFunction((n) => window.shoalDashboard.updates >= n + 2,
      { timeout: 10000, polling: 100 }, updates);
    report.narrow = await page.evaluate(snapshot);
    report.narrow_overflow = await page.evaluate(overflow);
    report.narrow_screenshot = path.join(outDir, 'dashboard-narrow.png');
    await page.screenshot({ path: report.narrow_screenshot, fullPage: true });
  } finally {
    await browser.close();
  }
  return report;
}

main().then(
  (report) => console.log(JSON.stringify(report)),
  (e) => {
    console.log(JSON.stringify({ fatal: String(e && e.stack ? e.stack : e) }));
    process.exitCode = 1;
  });
