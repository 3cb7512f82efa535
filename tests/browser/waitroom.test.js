'use strict';
// End-to-end tests of the waitroom pages in Debian's headless Chromium, driven by playwright-core.
//
// Needs a running service at WAITROOM_URL (default http://127.0.0.1:8080) with its admin token in
// WAITROOM_ADMIN_TOKEN (default: the development token). Each test makes its own event and show
// with unique ids through the admin API, so runs do not disturb each other. Screenshots of every
// step go to SCREENSHOT_DIR (default: a new temporary folder, printed at start).
// Run: node --test waitroom.test.js   (scripts/check-browser does it all)

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');

const BASE = (process.env.WAITROOM_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const ADMIN = process.env.WAITROOM_ADMIN_TOKEN || 'dev-admin-token';
const SHOTS = process.env.SCREENSHOT_DIR || fs.mkdtempSync(path.join(os.tmpdir(), 'waitroom-shots-'));
const RUN = Date.now().toString(36) + Math.random().toString(36).slice(2, 6);
// The flags INFRA.md found to work as root here; playwright-core adds a fresh --user-data-dir
// of its own for every launch (it refuses one in `args`).
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

fs.mkdirSync(SHOTS, { recursive: true });
console.log(`# service: ${BASE}`);
console.log(`# screenshots: ${SHOTS}`);

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: FLAGS });
  console.log(`# chromium ${browser.version()}`);
});
after(async () => { if (browser) await browser.close(); });

// ---- helpers -------------------------------------------------------------------------------

async function call(method, p, body, token) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(BASE + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let data = null;
  try { data = JSON.parse(text); } catch { data = text; }
  return { status: res.status, data };
}
const admin = (method, p, body) => call(method, p, body, ADMIN);

function expectOk(r, what) {
  assert.ok(r.status >= 200 && r.status < 300, `${what}: HTTP ${r.status} ${JSON.stringify(r.data)}`);
  return r.data;
}

// An event of its own for one test, open, with `config` on top.
// The public seat map is a snapshot at most WAITROOM_SEAT_MAP_MAX_AGE_MS (1 s) old: wait for it.
async function seatStates(show, ids, state) {
  const deadline = Date.now() + 5000;
  for (;;) {
    const map = expectOk(await call('GET', `/v1/shows/${show}/seats`), 'seat map');
    if (ids.every((id) => map.seats.find((x) => x.id === id).state === state)) return map;
    if (Date.now() > deadline) assert.fail(`${ids} not ${state} within 5 s of the change`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function makeEvent(name, config) {
  const id = `e2e-${RUN}-${name}`;
  expectOk(await admin('PUT', `/admin/v1/events/${id}`, { state: 'open', ...config }), `create event ${id}`);
  return id;
}

async function makeShow(event, spec) {
  const id = `${event}-s`;
  expectOk(await admin('PUT', `/admin/v1/shows/${id}`, { event, ...spec }), `create show ${id}`);
  return id;
}

// Someone who entered through the API (to stand ahead of the browser, or to compete for seats).
async function enter(event, user) {
  return expectOk(await call('POST', `/v1/events/${event}/queue`, { user_id: user }), `enter ${user}`);
}

async function admittedToken(event, user) {
  const deadline = Date.now() + 20000;
  let s = await enter(event, user);
  while (s.status !== 'admitted') {
    assert.ok(Date.now() < deadline, `${user} was not admitted in 20 s: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 300));
    s = expectOk(await call('GET', `/v1/events/${event}/queue/${s.ticket}`), `poll ${user}`);
  }
  return s.access_token;
}

async function openPage(opts) {
  const context = await browser.newContext({ viewport: { width: 360, height: 780 }, ...opts });
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(String(e)));
  // Console errors too (a CSP violation is only logged), but not the HTTP errors the tests provoke.
  page.on('console', (m) => {
    if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) page.errors.push(m.text());
  });
  return { context, page };
}

async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`# screenshot ${file}`);
}

// The position the page shows, once it shows one.
async function position(page) {
  await page.waitForFunction(() => /^\d[\d,]*$/.test(document.getElementById('position').textContent) &&
    !document.getElementById('wait').hidden, null, { timeout: 20000 });
  return Number((await page.textContent('#position')).replace(/\D/g, ''));
}

// Signs the console in on `page` and waits for the card of `ev`: listed, or else watched by id.
// Returns the card's selector.
async function consoleCard(page, ev) {
  await page.goto(`${BASE}/admin`);
  await page.fill('#token', ADMIN);
  await page.click('#token-form button');
  const card = `article[data-event="${ev}"]`;
  try {
    await page.waitForSelector(card, { timeout: 5000 });
  } catch {
    console.log('# the console did not list the event (no GET /admin/v1/events?); watching it by id');
    await page.fill('#watch-event', ev);
    await page.click('#watch-form button');
    await page.waitForSelector(card, { timeout: 10000 });
  }
  return card;
}

const phase = (page) => page.getAttribute('body', 'data-phase');
const stored = (page, event) => page.evaluate((k) => JSON.parse(localStorage.getItem(k)), `waitroom:${event}`);

// ---- tests ---------------------------------------------------------------------------------

test('a buyer sees a position, is admitted, picks seats, holds and books them until confirmed', { timeout: 120000 }, async () => {
  const ev = await makeEvent('buy', { shards: 2, admit_per_second: 1, active_capacity: 0, max_seats_per_hold: 4, hold_ttl_seconds: 120 });
  const show = await makeShow(ev, { rows: 'A-C', seats_per_row: 8 });
  const { context, page } = await openPage();

  await page.goto(`${BASE}/events/${ev}`);
  const pos = await position(page);
  assert.ok(pos >= 1, `position ${pos}`);
  assert.equal(await page.textContent('#ahead'), String(pos - 1));
  assert.match(await page.textContent('#event-name'), /buy/);
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), 'no sideways scrolling at 360 px');
  await shot(page, '01-waiting');

  // The operator lets people in; the page learns it at its next advised poll.
  expectOk(await admin('PUT', `/admin/v1/events/${ev}`, { active_capacity: 100, admit_per_second: 50 }), 'admit');
  await page.waitForSelector('#seat-map button.seat', { timeout: 30000 });
  assert.equal(await phase(page), 'seats');
  assert.equal(await page.locator('#seat-map button.seat').count(), 24);
  await shot(page, '02-seat-map');

  // One seat by mouse, the next by keyboard (arrow, then Space).
  const first = page.locator('#seat-map button.seat[data-state=available]').first();
  await first.click();
  assert.equal(await first.getAttribute('aria-pressed'), 'true');
  await first.press('ArrowRight');
  await page.keyboard.press(' ');
  const picked = await page.$$eval('#seat-map button[aria-pressed=true]', (bs) => bs.map((b) => b.dataset.seat));
  assert.equal(picked.length, 2, `two seats chosen: ${picked}`);
  await shot(page, '03-seats-chosen');

  await page.click('#hold-btn');
  await page.waitForSelector('#hold:not([hidden])');
  const left = await page.textContent('#countdown');
  assert.match(left, /^[12]:\d\d$/, `countdown ${left}`);
  for (const s of picked) assert.match(await page.textContent('#held-seats'), new RegExp(s));
  await seatStates(show, picked, 'held');
  await page.waitForFunction((l) => document.getElementById('countdown').textContent !== l, left, { timeout: 3000 });
  await shot(page, '04-hold');

  await page.click('#confirm-btn');
  await page.waitForSelector('#booking-status[data-status=confirmed]', { timeout: 60000 });
  assert.match(await page.textContent('#booking-status'), /confirmed/i);
  await seatStates(show, picked, 'sold');
  const booking = (await stored(page, ev)).booking;
  assert.equal(expectOk(await call('GET', `/v1/bookings/${booking.booking_id}`), 'booking').status, 'confirmed');
  await shot(page, '05-confirmed');

  assert.deepEqual(page.errors, []);
  await context.close();
});

test('a refresh, and a browser restart, keep the same ticket and place', { timeout: 90000 }, async () => {
  const ev = await makeEvent('refresh', { shards: 2, admit_per_second: 1, active_capacity: 0 });
  await enter(ev, 'ahead-1');
  await enter(ev, 'ahead-2');
  const { context, page } = await openPage();

  await page.goto(`${BASE}/events/${ev}`);
  const pos1 = await position(page);
  const ticket1 = await page.textContent('#ticket');
  assert.equal((await stored(page, ev)).ticket, ticket1);
  assert.ok(pos1 >= 3, `two people are ahead: position ${pos1}`);
  await shot(page, '06-before-reload');

  const queueCalls = [];
  page.on('request', (r) => { if (r.url().includes('/queue')) queueCalls.push(`${r.method()} ${new URL(r.url()).pathname}`); });
  await page.reload();
  const pos2 = await position(page);
  assert.equal(await page.textContent('#ticket'), ticket1);
  assert.ok(pos2 <= pos1, `position ${pos2} after reload, ${pos1} before`);
  assert.equal(queueCalls[0], `GET /v1/events/${ev}/queue/${ticket1}`, 'the page polls its stored ticket');
  await shot(page, '07-after-reload');

  // A browser restart: a new context that starts from the same stored state.
  const state = await context.storageState();
  await context.close();
  const again = await openPage({ storageState: state });
  await again.page.goto(`${BASE}/events/${ev}`);
  const pos3 = await position(again.page);
  assert.equal(await again.page.textContent('#ticket'), ticket1);
  assert.ok(pos3 <= pos1, `position ${pos3} after restart, ${pos1} before`);
  await shot(again.page, '08-after-restart');

  assert.deepEqual([...page.errors, ...again.page.errors], []);
  await again.context.close();
});

test('a 503 on the poll shows the retry message, waits Retry-After, and the page recovers', { timeout: 90000 }, async () => {
  const ev = await makeEvent('busy', { shards: 2, admit_per_second: 1, active_capacity: 0 });
  const { context, page } = await openPage();
  await page.goto(`${BASE}/events/${ev}`);
  await position(page);
  const ticket = await page.textContent('#ticket');

  // The next two polls get 503 with Retry-After: 2; later ones reach the service.
  const refused = [], passed = [];
  await page.route(`**/v1/events/${ev}/queue/*`, (route) => {
    if (route.request().method() !== 'GET') return route.continue();
    if (refused.length < 2) {
      refused.push(Date.now());
      return route.fulfill({
        status: 503,
        headers: { 'Retry-After': '2', 'Content-Type': 'application/json' },
        body: JSON.stringify({ error: 'unavailable', message: 'the waiting line cannot be reached right now; try again shortly' }),
      });
    }
    passed.push(Date.now());
    return route.continue();
  });
  await page.waitForSelector('#retry-note:not([hidden])', { timeout: 20000 });
  assert.match(await page.textContent('#retry-note'), /retrying in 2 s/i);
  await shot(page, '09-retry');

  await page.waitForFunction(() => document.getElementById('retry-note').hidden, null, { timeout: 20000 });
  await position(page);
  assert.equal(await page.textContent('#ticket'), ticket);
  assert.equal(await phase(page), 'waiting');
  assert.equal(refused.length, 2);
  assert.ok(refused[1] - refused[0] >= 1900, `second try ${refused[1] - refused[0]} ms after the first`);
  assert.ok(passed[0] - refused[1] >= 1900, `recovery ${passed[0] - refused[1]} ms after the second`);
  await shot(page, '10-recovered');

  assert.deepEqual(page.errors, []);
  await context.close();
});

test('a full waiting room says so, promises no place, and lets the buyer in once it has room', { timeout: 90000 }, async () => {
  const ev = await makeEvent('full', { shards: 2, admit_per_second: 1, active_capacity: 0 });
  const { context, page } = await openPage();
  // The first enter gets the memory guard's answer (503, the room full); the next reaches the
  // service.
  const refused = [];
  await page.route(`**/v1/events/${ev}/queue`, (route) => {
    if (route.request().method() !== 'POST' || refused.length >= 1) return route.continue();
    refused.push(Date.now());
    return route.fulfill({
      status: 503,
      headers: { 'Retry-After': '2', 'Content-Type': 'application/json' },
      body: JSON.stringify({ error: 'unavailable', message: 'the waiting room is full for now; try again later' }),
    });
  });
  await page.goto(`${BASE}/events/${ev}`);
  await page.waitForSelector('#retry-note:not([hidden])', { timeout: 20000 });
  const said = await page.textContent('#retry-note');
  assert.match(said, /waiting room is full/i);
  assert.match(said, /retrying in 2 s/i);
  assert.doesNotMatch(said, /place is kept/i);
  await shot(page, '10b-full');

  await page.waitForFunction(() => document.getElementById('retry-note').hidden, null, { timeout: 20000 });
  await position(page);
  assert.equal(await phase(page), 'waiting');
  assert.equal(refused.length, 1);
  assert.deepEqual(page.errors, []);
  await context.close();
});

test('the console switches the strategy and the open page keeps its place', { timeout: 90000 }, async () => {
  const ev = await makeEvent('switch', { shards: 1, admit_per_second: 1, active_capacity: 0, strategy: 'timestamp' });
  for (const u of ['ahead-1', 'ahead-2', 'ahead-3']) await enter(ev, u);
  const buyer = await openPage();
  await buyer.page.goto(`${BASE}/events/${ev}`);
  const pos1 = await position(buyer.page);
  const ticket = await buyer.page.textContent('#ticket');

  const ops = await openPage({ viewport: { width: 1100, height: 900 } });
  const card = await consoleCard(ops.page, ev);
  await ops.page.waitForFunction((c) => Number(document.querySelector(`${c} [data-f=waiting]`).textContent) >= 4, card, { timeout: 10000 });
  assert.equal(await ops.page.getAttribute(card, 'data-strategy'), 'timestamp');
  // Created without a line_form: the numbered line, which keeps no per-shard counts, so the
  // card says so instead of showing an empty shard table.
  assert.equal(await ops.page.getAttribute(card, 'data-line-form'), 'numbered');
  assert.equal(await ops.page.isVisible(`${card} [data-f=shard-table]`), false, 'no empty shard table');
  assert.match(await ops.page.textContent(`${card} [data-f=form]`), /Numbered line/);
  await shot(ops.page, '11-console');

  await ops.page.selectOption(`${card} select[data-f=pick]`, 'statistical');
  await ops.page.click(`${card} button[data-act=strategy]`);
  await ops.page.waitForSelector(`${card}[data-strategy=statistical]`, { timeout: 10000 });
  assert.match(await ops.page.textContent(`${card} [data-f=msg]`), /statistical/);
  assert.equal(expectOk(await admin('GET', `/admin/v1/events/${ev}`), 'event').stats.strategy, 'statistical');
  await shot(ops.page, '12-console-switched');

  // Two polls after the switch: same ticket, still waiting, no further back.
  for (let i = 0; i < 2; i++) {
    await buyer.page.waitForResponse((r) => new URL(r.url()).pathname.endsWith(`/queue/${ticket}`) && r.status() === 200, { timeout: 20000 });
  }
  const pos2 = await position(buyer.page);
  assert.equal(await buyer.page.textContent('#ticket'), ticket);
  assert.equal(await phase(buyer.page), 'waiting');
  assert.ok(pos2 <= pos1, `position ${pos2} after the switch, ${pos1} before`);
  await shot(buyer.page, '13-page-after-switch');

  assert.deepEqual([...buyer.page.errors, ...ops.page.errors], []);
  await buyer.context.close();
  await ops.context.close();
});

test('the console says when the memory guard turns new people away', { timeout: 60000 }, async () => {
  const ev = await makeEvent('door', { shards: 1, admit_per_second: 1, active_capacity: 0 });
  const ops = await openPage({ viewport: { width: 1100, height: 900 } });
  // The service's own answers, with the guard's flag set as a closed guard sets it.
  let closed = true;
  const flag = (v) => {
    if (Array.isArray(v)) v.forEach(flag);
    else if (v && typeof v === 'object') {
      if (v.stats && typeof v.stats === 'object') v.stats.turning_away = closed;
      Object.values(v).forEach(flag);
    }
  };
  await ops.page.route('**/admin/v1/events**', async (route) => {
    if (route.request().method() !== 'GET') return route.continue();
    const res = await route.fetch();
    const body = await res.json();
    flag(body);
    return route.fulfill({ response: res, json: body });
  });
  const card = await consoleCard(ops.page, ev);
  await ops.page.waitForSelector(`${card}[data-turning-away=true] [data-f=door]:not([hidden])`, { timeout: 10000 });
  assert.match(await ops.page.textContent(`${card} [data-f=door]`), /turned away.*memory/i);
  await shot(ops.page, '13b-console-turning-away');

  closed = false;
  await ops.page.waitForSelector(`${card}[data-turning-away=false] [data-f=door][hidden]`, { state: 'attached', timeout: 10000 });
  assert.deepEqual(ops.page.errors, []);
  await ops.context.close();
});

test('the hold limit and a seat taken by someone else are shown, then a hold succeeds', { timeout: 90000 }, async () => {
  const ev = await makeEvent('taken', { shards: 1, admit_per_second: 50, active_capacity: 100, max_seats_per_hold: 2 });
  const show = await makeShow(ev, { rows: 'A', seats_per_row: 6 });
  const { context, page } = await openPage();
  await page.goto(`${BASE}/events/${ev}?show=${show}`);
  await page.waitForSelector('#seat-map button.seat', { timeout: 30000 });
  for (const s of ['A-1', 'A-2', 'A-3']) await page.click(`#seat-map [data-seat="${s}"]`);

  // A rival, admitted too, holds A-2 first.
  const rival = await admittedToken(ev, 'rival');
  expectOk(await call('POST', `/v1/shows/${show}/holds`, { seats: ['A-2'] }, rival), 'rival hold');

  // Three seats are over the event's limit of 2: the page learns the limit from the 400.
  await page.click('#hold-btn');
  await page.waitForFunction(() => /up to 2 seats/.test(document.getElementById('seat-error').textContent));
  assert.equal(await page.textContent('#limit'), '2');
  assert.equal(await page.locator('#seat-map button[aria-pressed=true]').count(), 2);

  // A-2 is taken: the page names it and shows it held.
  await page.click('#hold-btn');
  await page.waitForFunction(() => /just taken: A-2/.test(document.getElementById('seat-error').textContent));
  await page.waitForSelector('#seat-map [data-seat="A-2"][data-state=held]:disabled');
  assert.equal(await page.getAttribute('#seat-map [data-seat="A-1"]', 'aria-pressed'), 'true');
  await shot(page, '14-seat-taken');

  await page.click('#hold-btn');
  await page.waitForSelector('#hold:not([hidden])');
  assert.equal(await page.textContent('#held-seats'), 'A-1');
  await shot(page, '15-held-after-taken');

  assert.deepEqual(page.errors, []);
  await context.close();
});

test('general admission: a quantity picker books places, and the next visitor is told it is sold out', { timeout: 120000 }, async () => {
  const ev = await makeEvent('ga', { shards: 1, admit_per_second: 50, active_capacity: 100, max_seats_per_hold: 4 });
  const show = await makeShow(ev, { quantity: 2 });
  const { context, page } = await openPage();
  await page.goto(`${BASE}/events/${ev}?show=${show}`);
  await page.waitForSelector('#ga:not([hidden])', { timeout: 30000 });
  assert.ok(await page.isHidden('#seat-pick'));
  await page.fill('#qty', '2');
  await shot(page, '16-ga-quantity');
  await page.click('#hold-btn');
  await page.waitForSelector('#hold:not([hidden])');
  assert.equal(await page.textContent('#held-seats'), '2 places');
  await page.click('#confirm-btn');
  await page.waitForSelector('#booking-status[data-status=confirmed]', { timeout: 60000 });
  await shot(page, '17-ga-confirmed');

  // Every place is sold: once the service says so, a newcomer's page says it plainly.
  const deadline = Date.now() + 15000;
  for (let i = 0; (await enter(ev, `probe-${i}`)).status !== 'sold_out'; i++) {
    assert.ok(Date.now() < deadline, 'the event was not reported sold out within 15 s');
    await new Promise((r) => setTimeout(r, 500));
  }
  const late = await openPage();
  await late.page.goto(`${BASE}/events/${ev}`);
  await late.page.waitForFunction(() => document.body.dataset.phase === 'sold_out', null, { timeout: 20000 });
  assert.match(await late.page.textContent('#message'), /sold out/i);
  await shot(late.page, '18-sold-out');

  assert.deepEqual([...page.errors, ...late.page.errors], []);
  await context.close();
  await late.context.close();
});

test('a closed sale is said plainly', { timeout: 60000 }, async () => {
  const ev = await makeEvent('closed', { state: 'closed' });
  const { context, page } = await openPage();
  await page.goto(`${BASE}/events/${ev}`);
  await page.waitForFunction(() => document.body.dataset.phase === 'closed', null, { timeout: 20000 });
  assert.match(await page.textContent('#message'), /sale is closed/);
  assert.ok(await page.isHidden('#wait'));
  await shot(page, '19-closed');
  assert.deepEqual(page.errors, []);
  await context.close();
});

test('a hidden tab stops polling and polls at once when shown again', { timeout: 60000 }, async () => {
  const ev = await makeEvent('hidden', { shards: 1, admit_per_second: 1, active_capacity: 0 });
  const { context, page } = await openPage();
  await page.goto(`${BASE}/events/${ev}`);
  await position(page);
  const polls = [];
  page.on('request', (r) => { if (r.method() === 'GET' && r.url().includes('/queue/')) polls.push(Date.now()); });
  // Headless tabs are always visible: stand in for the browser's own hiding.
  const setHidden = (hidden) => page.evaluate((h) => {
    window.__hidden = h;
    Object.defineProperty(document, 'hidden', { configurable: true, get: () => window.__hidden });
    document.dispatchEvent(new Event('visibilitychange'));
  }, hidden);

  await setHidden(true);
  await page.waitForTimeout(300);
  const before = polls.length;
  await page.waitForTimeout(4000); // about four advised intervals
  assert.equal(polls.length, before, 'no poll while hidden');
  const shown = Date.now();
  await setHidden(false);
  await page.waitForRequest((r) => r.method() === 'GET' && r.url().includes('/queue/'), { timeout: 3000 });
  assert.ok(Date.now() - shown < 1000, `polled ${Date.now() - shown} ms after being shown`);
  assert.deepEqual(page.errors, []);
  await context.close();
});
