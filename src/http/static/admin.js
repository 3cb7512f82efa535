// waitroom: the operator console (/admin). Uses only the admin API with the token typed in,
// kept in sessionStorage. Refreshes every 2 s; cards are updated in place, so a control the
// operator is using is not rebuilt under them.
(function () {
  'use strict';
  var $ = function (id) { return document.getElementById(id); };
  var enc = encodeURIComponent;
  var STRATEGIES = ['global_counter', 'timestamp', 'statistical', 'hybrid'];
  var TOKEN = 'waitroom:admin-token', WATCH = 'waitroom:admin-watch';
  var cards = {}, timer = 0, listMissing = false;

  function token() { return sessionStorage.getItem(TOKEN) || ''; }
  function watched() { try { return JSON.parse(sessionStorage.getItem(WATCH)) || []; } catch (e) { return []; } }
  function note(text, bad) {
    var el = $('console-note');
    el.textContent = text || '';
    el.hidden = !text;
    el.className = 'notice' + (bad ? ' bad' : '');
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function num(n, digits) {
    return n == null ? '—' : Number(n).toLocaleString('en', { maximumFractionDigits: digits || 0 });
  }

  function api(method, path, body) {
    var headers = { Authorization: 'Bearer ' + token() };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    return fetch(path, {
      method: method, headers: headers, cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (res) {
      var ra = parseFloat(res.headers.get('Retry-After'));
      return res.json().catch(function () { return null; }).then(function (data) {
        return { status: res.status, data: data, retryAfter: isFinite(ra) ? ra * 1000 : null };
      });
    }, function () { return { status: 0, data: null, retryAfter: null }; });
  }
  function failed(r, what) {
    if (r.status === 401) { logout('The admin token was refused. Type it again.'); return true; }
    if (r.status >= 200 && r.status < 300) return false;
    note(what + ': ' + ((r.data && r.data.message) || (r.status ? 'HTTP ' + r.status : 'the service cannot be reached')), true);
    return true;
  }

  // ---- token ---------------------------------------------------------------------------------
  function logout(msg) {
    clearTimeout(timer);
    sessionStorage.removeItem(TOKEN);
    $('console').hidden = true;
    $('login').hidden = false;
    note(msg || '', !!msg);
    $('token').focus();
  }
  $('token-form').addEventListener('submit', function (e) {
    e.preventDefault();
    sessionStorage.setItem(TOKEN, $('token').value.trim());
    $('token').value = '';
    start();
  });
  $('logout').addEventListener('click', function () { logout(''); });
  $('watch-form').addEventListener('submit', function (e) {
    e.preventDefault();
    var id = $('watch-event').value.trim(), w = watched();
    if (w.indexOf(id) < 0) w.push(id);
    sessionStorage.setItem(WATCH, JSON.stringify(w));
    $('watch-event').value = '';
    refresh();
  });

  // ---- events --------------------------------------------------------------------------------
  function refresh() {
    clearTimeout(timer);
    var list = listMissing ? Promise.resolve(null) : api('GET', '/admin/v1/events');
    list.then(function (r) {
      if (r && r.status === 404) listMissing = true;
      else if (r && r.status === 401) return failed(r, '');
      else if (r && (r.status === 429 || r.status === 503 || r.status === 0)) return later(r);
      else if (r && failed(r, 'Listing events')) return later(r);
      var events = (r && r.data && r.data.events) || [];
      var have = {};
      events.forEach(function (ev) { have[ev.event] = 1; });
      var extra = watched().filter(function (id) { return !have[id]; });
      return Promise.all(extra.map(function (id) {
        return api('GET', '/admin/v1/events/' + enc(id)).then(function (x) {
          if (x.status === 200 && x.data) events.push(x.data);
          else if (x.status === 404) ensure(id).querySelector('[data-f=msg]').textContent = 'No such event.';
          else failed(x, 'Reading ' + id);
        });
      })).then(function () {
        events.forEach(update);
        $('no-events').hidden = events.length > 0 || extra.length > 0;
        if (listMissing && !events.length) note('This service has no event list; watch an event by its id.');
        else if (!listMissing) note('');
        $('updated').textContent = 'Last update ' + new Date().toLocaleTimeString();
        var dl = $('event-ids');
        dl.textContent = '';
        Object.keys(cards).forEach(function (id) { dl.appendChild(el('option', { value: id })); });
        later(null);
      });
    });
  }
  function later(r) {
    clearTimeout(timer);
    var ms = r && r.retryAfter != null ? Math.max(2000, r.retryAfter) : 2000;
    if (r && (r.status === 429 || r.status === 503 || r.status === 0)) {
      note('The service is busy or unreachable; retrying in ' + Math.ceil(ms / 1000) + ' s.', true);
    }
    if (token()) timer = setTimeout(refresh, ms);
  }

  // The card of one event, made once.
  function ensure(id) {
    if (cards[id]) return cards[id];
    var c = el('article', { 'class': 'card', 'data-event': id, 'aria-label': 'Event ' + id });
    c.innerHTML =
      '<h2><span data-f="id"></span> <small class="muted" data-f="state"></small></h2>' +
      '<p class="notice bad" data-f="door" role="status" hidden></p>' +
      '<dl class="figures"><div><dt>Waiting</dt><dd data-f="waiting">—</dd></div>' +
      '<div><dt>Active</dt><dd data-f="active">—</dd></div>' +
      '<div><dt>Admitted / s</dt><dd><span data-f="measured">—</span>' +
      '<small class="muted"> of <span data-f="configured">—</span></small></dd></div></dl>' +
      '<p class="muted">Admitted in all: <span data-f="total">—</span> · capacity <span data-f="capacity">—</span>' +
      ' · leader <span data-f="leader">—</span></p>' +
      '<p>Strategy <strong data-f="strategy">—</strong>, in effect <strong data-f="effective">—</strong>' +
      '<span data-f="error"></span></p>' +
      '<p class="muted" data-f="form"></p>' +
      '<table data-f="shard-table"><thead><tr><th scope="col">Shard</th><th scope="col">Waiting</th><th scope="col" class="w50"><span class="muted">share</span></th></tr></thead>' +
      '<tbody data-f="shards"></tbody></table>' +
      '<div class="actions"><button type="button" data-state="open">Open</button>' +
      '<button type="button" data-state="paused">Pause</button><button type="button" data-state="closed">Close</button></div>' +
      '<div class="actions"><label>Ranking strategy <select data-f="pick"></select></label>' +
      '<button type="button" data-act="strategy" class="primary">Switch strategy</button></div>' +
      '<p data-f="msg" role="status"></p>';
    c.querySelector('[data-f=id]').textContent = id;
    var pick = c.querySelector('[data-f=pick]');
    STRATEGIES.forEach(function (s) { pick.appendChild(el('option', { value: s }, s)); });
    c.addEventListener('click', function (e) {
      var b = e.target.closest('button');
      if (!b) return;
      var msg = c.querySelector('[data-f=msg]'), s = b.getAttribute('data-state');
      var req = s ? api('PUT', '/admin/v1/events/' + enc(id), { state: s })
        : api('PUT', '/admin/v1/events/' + enc(id) + '/strategy', { strategy: pick.value });
      b.disabled = true;
      req.then(function (r) {
        b.disabled = false;
        if (r.status === 401) return failed(r, '');
        msg.textContent = r.status === 200 || r.status === 201
          ? (s ? 'State set to ' + s + '.' : 'Strategy switched to ' + r.data.strategy + '.')
          : 'Refused: ' + ((r.data && r.data.message) || 'HTTP ' + r.status);
        refresh();
      });
    });
    cards[id] = c;
    $('events').appendChild(c);
    return c;
  }
  function update(ev) {
    var c = ensure(ev.event), cfg = ev.config || {}, st = ev.stats || {};
    var set = function (f, v) { c.querySelector('[data-f=' + f + ']').textContent = v; };
    if (!c.getAttribute('data-picked')) {
      c.querySelector('[data-f=pick]').value = cfg.strategy || st.strategy;
      c.setAttribute('data-picked', '1');
    }
    set('state', cfg.state || '');
    // The memory guard (docs/operations.md, WaitroomTurningPeopleAway).
    var door = c.querySelector('[data-f=door]');
    door.hidden = !st.turning_away;
    door.textContent = st.turning_away
      ? 'New people are turned away: a Redis node of this line is near its memory limit. Everyone in the line is still served.' : '';
    c.setAttribute('data-turning-away', st.turning_away ? 'true' : 'false');
    set('waiting', num(st.waiting));
    set('active', num(st.active));
    set('measured', num(st.measured_admit_per_second, 1));
    set('configured', num(cfg.admit_per_second, 1));
    set('total', num(st.admitted_total));
    set('capacity', num(cfg.active_capacity));
    set('leader', st.admission_leader || 'none');
    set('strategy', st.strategy || cfg.strategy || '—');
    set('effective', st.effective_strategy || '—');
    set('error', st.measured_position_error != null ? ', position error ' + num(100 * st.measured_position_error, 2) + ' %' : '');
    c.setAttribute('data-strategy', st.strategy || '');
    c.setAttribute('data-effective', st.effective_strategy || '');
    ['open', 'paused', 'closed'].forEach(function (s) {
      c.querySelector('[data-state=' + s + ']').setAttribute('aria-pressed', cfg.state === s ? 'true' : 'false');
    });
    // A numbered line (the default) orders everyone by one counter and keeps no per-shard
    // counts: its stats carry no shards, so the table would stand empty.
    var numbered = cfg.line_form === 'numbered';
    c.setAttribute('data-line-form', cfg.line_form || 'sorted_sets');
    set('form', numbered ? 'Numbered line: one counter orders everyone; no per-shard counts.'
      : 'Sorted sets over ' + num(cfg.shards) + ' shards.');
    c.querySelector('[data-f=shard-table]').hidden = numbered;
    var shards = st.shards || [], max = 1, body = c.querySelector('[data-f=shards]');
    shards.forEach(function (s) { max = Math.max(max, s.waiting); });
    body.textContent = '';
    shards.forEach(function (s) {
      var tr = el('tr');
      tr.appendChild(el('td', null, String(s.shard)));
      tr.appendChild(el('td', null, num(s.waiting)));
      var td = el('td'), bar = el('div', { 'class': 'bar', 'aria-hidden': 'true' });
      bar.style.width = (100 * s.waiting / max) + '%';
      td.appendChild(bar);
      tr.appendChild(td);
      body.appendChild(tr);
    });
  }

  // ---- shows ---------------------------------------------------------------------------------
  function kind() { return $('show-kind').value; }
  $('show-kind').addEventListener('change', function () {
    Array.prototype.forEach.call(document.querySelectorAll('[data-kind]'), function (l) {
      l.hidden = l.getAttribute('data-kind') !== kind();
    });
  });
  $('show-form').addEventListener('submit', function (e) {
    e.preventDefault();
    var body = { event: $('show-event').value.trim() }, k = kind();
    if (k === 'rows') { body.rows = $('show-rows').value.trim(); body.seats_per_row = parseInt($('show-per-row').value, 10); }
    if (k === 'seats') body.seats = $('show-seats').value.split(/[\s,]+/).filter(Boolean);
    if (k === 'quantity') body.quantity = parseInt($('show-quantity').value, 10);
    var id = $('show-id').value.trim(), out = $('show-result');
    out.textContent = 'Creating…';
    api('PUT', '/admin/v1/shows/' + enc(id), body).then(function (r) {
      if (r.status === 401) return failed(r, '');
      out.textContent = r.status === 200 || r.status === 201
        ? (r.status === 201 ? 'Created' : 'Already there:') + ' show ' + r.data.show + ' of ' + r.data.event + ', ' +
          num(r.data.seat_count) + (r.data.kind === 'ga' ? ' places.' : ' seats.')
        : 'Refused: ' + ((r.data && r.data.message) || 'HTTP ' + r.status);
    });
  });

  function start() {
    if (!token()) return logout('');
    $('login').hidden = true;
    $('console').hidden = false;
    note('');
    refresh();
  }
  start();
})();
