// Opens glass's outputs in headless Chromium as a person would, for tests/formats.rs.
//
//   node formats_browser.js speedscope DIST_DIR PROFILE.json
//       loads the profile in speedscope (served from DIST_DIR), switches to the sandwich
//       view and prints its table: [{name, total, self}] (times as speedscope shows them)
//   node formats_browser.js svg FILE.svg FUNCTION SEARCH
//       opens a flame graph, clicks FUNCTION's frame (zoom) and searches for SEARCH
//
// Prints one JSON object; page errors and dialogs other than the search prompt are
// reported in `errors`.
const { chromium } = require('playwright-core');
const fs = require('fs');
const path = require('path');

async function launch() {
  return chromium.launch({
    executablePath: process.env.GLASS_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

function watch(page, errors) {
  page.on('pageerror', (e) => errors.push('page error: ' + String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push('console: ' + m.text()); });
}

async function speedscope(dist, profile) {
  const browser = await launch();
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  watch(page, errors);
  page.on('dialog', (d) => { errors.push('dialog: ' + d.message()); d.dismiss(); });
  // speedscope and the profile from one made-up origin, served from files: no server.
  await page.route('http://glass.test/**', (route) => {
    const url = new URL(route.request().url());
    const file = url.pathname === '/profile.json' ? profile : path.join(dist, url.pathname);
    if (!fs.existsSync(file)) return route.fulfill({ status: 404, body: '' });
    const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css',
      '.json': 'application/json', '.wasm': 'application/wasm' };
    return route.fulfill({ status: 200, body: fs.readFileSync(file),
      contentType: types[path.extname(file)] || 'application/octet-stream' });
  });
  await page.goto('http://glass.test/index.html#profileURL=' +
    encodeURIComponent('http://glass.test/profile.json'));
  // The sandwich view's table lists every function with its total and self time.
  let rows = [];
  let title = '';
  for (let attempt = 0; attempt < 40 && rows.length === 0; attempt++) {
    await page.waitForTimeout(250);
    await page.keyboard.press('3');
    const text = await page.evaluate(() => document.body.innerText);
    title = text.split('\n')[1] || '';
    const lines = text.split('\n').map((l) => l.trim()).filter((l) => l.length > 0);
    const header = lines.indexOf('Total\tSelf\tSymbol Name');
    const start = header >= 0 ? header + 1 : lines.findIndex((l) => l.startsWith('Symbol Name')) + 1;
    if (start <= 0) continue;
    for (let i = start; i + 2 < lines.length + 1; i += 3) {
      if (lines[i + 2] === undefined) break;
      rows.push({ total: lines[i], self: lines[i + 1], name: lines[i + 2] });
    }
  }
  await browser.close();
  return { errors, title, rows };
}

async function svg(file, fn, term) {
  const browser = await launch();
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  watch(page, errors);
  let prompted = false;
  page.on('dialog', (d) => {
    if (d.type() === 'prompt') { prompted = true; d.accept(term); } else { errors.push('dialog: ' + d.message()); d.dismiss(); }
  });
  await page.goto('file://' + path.resolve(file), { waitUntil: 'load' });
  // The SVG's init() (on load) sets up its handlers and its fluid drawing.
  await page.waitForFunction(() => typeof details !== 'undefined' && details !== null &&
    document.querySelectorAll('#frames > g').length > 0, null, { timeout: 10000 });
  const frameBox = async (name) => page.evaluate((name) => {
    const boxes = [];
    for (const g of document.querySelectorAll('#frames > g')) {
      const title = g.querySelector('title').textContent;
      if (title.startsWith(name + ' (')) {
        const r = g.querySelector('rect').getBoundingClientRect();
        boxes.push({ title, x: r.x, width: r.width, hidden: g.classList.contains('hide'),
          fill: g.querySelector('rect').getAttribute('fill') });
      }
    }
    return boxes;
  }, name);
  const rendered = await page.evaluate(() => {
    const frames = document.getElementById('frames');
    const r = frames.getBoundingClientRect();
    return { frames: document.querySelectorAll('#frames > g').length, x: r.x, width: r.width,
      titles: Array.from(document.querySelectorAll('#frames > g > title')).map((t) => t.textContent) };
  });
  const before = await frameBox(fn);
  // A click on the widest frame of FN zooms into it.
  const index = await page.evaluate((name) => {
    let best = -1; let width = -1;
    document.querySelectorAll('#frames > g').forEach((g, i) => {
      const title = g.querySelector('title').textContent;
      const w = g.querySelector('rect').getBoundingClientRect().width;
      if (title.startsWith(name + ' (') && w > width) { best = i; width = w; }
    });
    return best;
  }, fn);
  if (index >= 0) {
    await page.locator('#frames > g').nth(index).locator('rect').click();
    await page.waitForFunction(() => !document.getElementById('unzoom').classList.contains('hide'),
      null, { timeout: 10000 }).catch(() => {});
    await page.waitForTimeout(100);
  }
  const after = await frameBox(fn);
  const unzoom = await page.evaluate(() => !document.getElementById('unzoom').classList.contains('hide'));
  // Reset the zoom, then search as a person does: the Search button and its prompt.
  if (unzoom) {
    await page.locator('#unzoom').click();
    await page.waitForFunction(() => document.getElementById('unzoom').classList.contains('hide'),
      null, { timeout: 10000 }).catch(() => {});
  }
  await page.locator('#search').click();
  await page.waitForFunction(() => document.getElementById('matched').textContent.trim() !== '',
    null, { timeout: 10000 }).catch(() => {});
  const searched = await page.evaluate(() => {
    const matched = document.getElementById('matched').textContent;
    const highlighted = [];
    for (const g of document.querySelectorAll('#frames > g')) {
      const fill = g.querySelector('rect').getAttribute('fill');
      if (fill === 'rgb(230,0,230)') highlighted.push(g.querySelector('title').textContent);
    }
    return { matched, highlighted };
  });
  await page.screenshot({ path: file + '.png' });
  await browser.close();
  return { errors, rendered, before, after, unzoom, prompted, ...searched };
}

(async () => {
  const [mode, a, b, c] = process.argv.slice(2);
  try {
    const result = mode === 'speedscope' ? await speedscope(a, b) : await svg(a, b, c);
    console.log(JSON.stringify(result));
  } catch (e) {
    console.log(JSON.stringify({ errors: ['harness: ' + String(e && e.stack || e)] }));
    process.exitCode = 1;
  }
})();
