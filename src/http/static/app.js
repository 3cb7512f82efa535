// waitroom: the waiting-room page (/events/{event}) and the index (/).
// Polls exactly as the server advises (next_poll_ms, Retry-After), keeps the user id and ticket
// in localStorage per event so a refresh or a browser restart keeps the place, then shows the
// seat map, the hold with its countdown, and the booking until it is confirmed or rejected.
(function () {
  'use strict';
  var $ = function (id) { return document.getElementById(id); };

  // The index: a form that opens /events/{id}.
  var go = $('go');
  if (go) {
    go.addEventListener('submit', function (e) {
      e.preventDefault();
      location.href = '/events/' + encodeURIComponent($('event').value.trim());
    });
    return;
  }

  var event = decodeURIComponent(location.pathname.split('/').filter(Boolean)[1] || '');
  var enc = encodeURIComponent;
  var params = new URLSearchParams(location.search);
  var storeKey = 'waitroom:' + event;
  var DEFAULT_LIMIT = 4;

  var saved = {};
  try { saved = JSON.parse(localStorage.getItem(storeKey)) || {}; } catch (e) { saved = {}; }
  function save() {
    try { localStorage.setItem(storeKey, JSON.stringify(saved)); } catch (e) { /* private mode */ }
  }
  // Verified entry (docs/api.md): the selling site links here with #user_id=…&entry_token=…
  // (a fragment, so neither reaches any server log); the page keeps them and drops the fragment.
  var frag = new URLSearchParams(location.hash.slice(1));
  if (frag.get('user_id') && frag.get('entry_token')) {
    if (saved.user !== frag.get('user_id')) saved = {};
    saved.user = frag.get('user_id');
    saved.entry = frag.get('entry_token');
    save();
    history.replaceState(null, '', location.pathname + location.search);
  }
  if (!saved.user) {
    var b = new Uint8Array(16);
    crypto.getRandomValues(b);
    saved.user = 'u-' + Array.prototype.map.call(b, function (x) { return (x + 256).toString(16).slice(1); }).join('');
    save();
  }

  var token = null, show = null, gaHint = false, ga = false, limit = DEFAULT_LIMIT;
  var chosen = [], timer = 0, nextFn = null, pending = null, backoffUntil = 0, failures = 0;
  var countdown = 0, skew = 0, lastLive = '';

  // ---- helpers -------------------------------------------------------------------------------
  function phase(p) { document.body.setAttribute('data-phase', p); }
  // Shows one section; when a later step appears, keyboard and screen-reader users are taken to it.
  function show1(id) {
    var appears = id && $(id).hidden;
    ['wait', 'shows', 'seats', 'hold', 'booking'].forEach(function (s) { $(s).hidden = s !== id; });
    if (appears && id !== 'wait') $(id).querySelector('h2').focus();
  }
  function note(id, text, kind) {
    var el = $(id);
    el.textContent = text || '';
    el.hidden = !text;
    if (kind !== undefined) el.className = 'notice' + (kind ? ' ' + kind : '');
  }
  function live(text) { if (text !== lastLive) { lastLive = text; $('live').textContent = text; } }
  function fmtInt(n) { return n == null ? '…' : Number(n).toLocaleString('en'); }
  function fmtEta(s) {
    if (s == null || !isFinite(s)) return 'not known yet';
    if (s < 1) return 'any moment';
    if (s < 10) return 'a few seconds';
    if (s < 60) return 'under a minute';
    if (s < 3600) return 'about ' + Math.round(s / 60) + ' min';
    return 'about ' + Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
  }
  function retryMs(r) {
    if (r.retryAfter != null) return r.retryAfter;
    failures++;
    return Math.min(30000, 1000 * Math.pow(2, Math.min(failures, 5)));
  }

  // One request; never throws. `retryAfter` is in ms (header in seconds, or an HTTP date).
  function api(method, path, body, bearer) {
    var headers = {};
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (bearer) headers.Authorization = 'Bearer ' + bearer;
    return fetch(path, {
      method: method, headers: headers, cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (res) {
      var h = res.headers.get('Retry-After'), ra = null;
      if (h != null) {
        ra = /^\d+(\.\d+)?$/.test(h.trim()) ? parseFloat(h) * 1000 : Date.parse(h) - Date.now();
        ra = isFinite(ra) ? Math.max(0, ra) : null;
      }
      var d = Date.parse(res.headers.get('Date') || '');
      if (d) skew = Math.abs(d - Date.now()) > 3000 ? d - Date.now() : 0;
      return res.json().catch(function () { return null; }).then(function (data) {
        return { status: res.status, data: data, retryAfter: ra };
      });
    }, function () { return { status: 0, data: null, retryAfter: null }; });
  }
  function err(r) { return (r.data && r.data.error) || ''; }
  function busy(r) { return r.status === 429 || r.status === 503 || r.status === 0; }

  // Every timed request goes through here: it waits while the tab is hidden and never runs
  // before a Retry-After has passed.
  function schedule(ms, fn) {
    clearTimeout(timer);
    nextFn = fn;
    timer = setTimeout(function () {
      timer = 0;
      if (document.hidden) { pending = fn; return; }
      fn();
    }, Math.max(0, ms, backoffUntil - Date.now()));
  }
  function stopTimer() { clearTimeout(timer); timer = 0; nextFn = pending = null; }
  document.addEventListener('visibilitychange', function () {
    if (document.hidden) return;
    var fn = pending || (timer ? nextFn : null);
    pending = null;
    if (fn) schedule(0, fn);
  });
  function retryLater(r, fn, what) {
    var ms = retryMs(r);
    backoffUntil = Date.now() + ms;
    // A full waiting room (the server's memory guard) turns away only people not in the line:
    // they have no place to keep.
    var full = r.status === 503 && /full/.test((r.data && r.data.message) || '');
    var why = r.status === 429 ? 'Many people are asking at once.'
      : r.status === 0 ? 'The connection was lost.'
      : full ? 'The waiting room is full right now.' : 'The service is busy.';
    var kept = saved.ticket && !full ? ' Your place is kept.' : '';
    note('retry-note', why + ' Retrying' + (what ? ' ' + what : '') + ' in ' + Math.ceil(ms / 1000) + ' s.' + kept);
    schedule(ms, fn);
  }
  function ok() { failures = 0; note('retry-note', ''); }

  // ---- the line ------------------------------------------------------------------------------
  function enter() {
    var body = { user_id: saved.user };
    if (saved.entry) body.entry_token = saved.entry;
    api('POST', '/v1/events/' + enc(event) + '/queue', body).then(function (r) { onQueue(r, enter); });
  }
  function poll() {
    if (!saved.ticket) return enter();
    // last=: the position on screen, so an estimate's noise within the event's error budget
    // does not move anyone back (docs/api.md); a real move back is still shown.
    var last = saved.shown ? '?last=' + saved.shown : '';
    api('GET', '/v1/events/' + enc(event) + '/queue/' + enc(saved.ticket) + last).then(function (r) {
      if (r.status === 404) { ok(); return enter(); } // left, lapsed or removed: enter again
      onQueue(r, poll);
    });
  }
  function onQueue(r, again) {
    if (r.status === 200 && r.data) { ok(); return status(r.data); }
    if (busy(r)) return retryLater(r, again, '');
    if (r.status === 404) { ok(); phase('unknown'); return note('message', 'There is no sale at this address. Please check the link.', 'bad'); }
    if (r.status === 401) {
      ok();
      phase('unknown');
      return note('message', 'This sale admits only buyers sent by the selling site. Please sign in there and follow its link again.', 'bad');
    }
    if (r.status === 409 && err(r) === 'event_closed') {
      ok();
      phase('closed');
      var paused = /paused/.test((r.data && r.data.message) || '');
      note('message', paused ? 'The sale is paused. Keep this page open: it checks again by itself.'
        : 'The sale is closed. This page checks again by itself in case it reopens.', '');
      return schedule(30000, again);
    }
    retryLater(r, again, '');
  }
  function status(s) {
    if (s.ticket && s.ticket !== saved.ticket) { saved.ticket = s.ticket; saved.first = null; saved.shown = null; save(); }
    $('ticket').textContent = saved.ticket || '—';
    if (s.status === 'admitted') return admitted(s);
    if (s.status === 'sold_out') {
      phase('sold_out');
      show1('');
      note('message', 'Sold out: every seat is sold or held right now. Held seats can come back, ' +
        'so this page keeps your place and checks again.', 'bad');
      live('Sold out.');
      return schedule(s.next_poll_ms || 10000, poll);
    }
    phase('waiting');
    note('message', '');
    show1('wait');
    var pos = s.position;
    if (pos != null && (!saved.first || pos > saved.first)) { saved.first = pos; }
    if (pos != null) { saved.shown = pos; save(); }
    $('position').textContent = fmtInt(pos);
    $('ahead').textContent = pos == null ? '…' : fmtInt(Math.max(0, pos - 1));
    $('eta').textContent = fmtEta(s.eta_seconds);
    var first = saved.first || pos || 1;
    $('progress').value = pos == null ? 0 : first > 1 ? Math.round(100 * (first - pos) / (first - 1)) : 100;
    if (pos != null) live(pos === 1 ? 'You are next in line.' : 'You are number ' + fmtInt(pos) + ' in line, ' + fmtInt(pos - 1) + ' ahead of you.');
    schedule(s.next_poll_ms != null ? s.next_poll_ms : 5000, poll);
  }

  // ---- seats ---------------------------------------------------------------------------------
  function admitted(s) {
    stopTimer();
    token = s.access_token;
    phase('admitted');
    note('message', '');
    live('It is your turn.');
    var until = s.access_expires_at ? new Date(s.access_expires_at * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) : '';
    $('turn').textContent = 'It is your turn.' + (until ? ' You can book until ' + until + '.' : '');
    var h = saved.hold;
    if (h && h.ticket === saved.ticket && Date.parse(h.expires_at) > Date.now() + skew) {
      show = h.show;
      return showHold();
    }
    if (show) return loadSeats();
    pickShow();
  }
  function pickShow() {
    var q = params.get('show');
    if (q) return openShow(q, null);
    api('GET', '/v1/events/' + enc(event) + '/shows').then(function (r) {
      if (busy(r)) return retryLater(r, pickShow, 'the seat map');
      ok();
      var list = r.status === 200 && r.data && r.data.shows;
      if (!list || !list.length) return note('message', 'No seats are on sale for this event right now.', 'bad');
      if (list.length === 1) return openShow(list[0].show, list[0]);
      show1('shows');
      var box = $('show-list');
      box.textContent = '';
      list.forEach(function (x) {
        var b = document.createElement('button');
        b.type = 'button';
        b.textContent = x.show + (x.general_admission ? ' (general admission)' : '');
        b.onclick = function () { openShow(x.show, x); };
        box.appendChild(b);
      });
    });
  }
  function openShow(id, info) {
    show = id;
    gaHint = !!(info && info.general_admission);
    loadSeats();
  }
  function loadSeats() {
    api('GET', '/v1/shows/' + enc(show) + '/seats').then(function (r) {
      if (busy(r)) return retryLater(r, loadSeats, 'the seat map');
      ok();
      if (r.status !== 200 || !r.data) return note('message', 'This show cannot be found.', 'bad');
      phase('seats');
      show1('seats');
      ga = gaHint || !r.data.seats || !r.data.seats.length;
      $('seat-pick').hidden = ga;
      $('ga').hidden = !ga;
      if (ga) {
        $('ga-available').textContent = fmtInt(r.data.available) + ' left.';
        $('qty').max = Math.max(1, Math.min(limit, r.data.available || limit));
        $('hold-btn').textContent = 'Hold these places';
      } else {
        renderMap(r.data.seats);
      }
      renderChosen();
    });
  }
  // Seats a 409 named as taken: the map is a copy up to a second old, so it may still show
  // them free for a moment; they are shown held until the copy catches up.
  var takenNow = {};
  function renderMap(seats) {
    var now = Date.now();
    seats = seats.map(function (st) {
      return st.state === 'available' && takenNow[st.id] > now ? { id: st.id, state: 'held' } : st;
    });
    var map = $('seat-map'), rows = {}, order = [], free = {};
    var focused = document.activeElement && document.activeElement.getAttribute('data-seat');
    map.textContent = '';
    seats.forEach(function (st) {
      var i = st.id.lastIndexOf('-'), row = i > 0 ? st.id.slice(0, i) : '';
      if (!rows[row]) { rows[row] = []; order.push(row); }
      rows[row].push(st);
      if (st.state === 'available') free[st.id] = 1;
    });
    chosen = chosen.filter(function (id) { return free[id]; });
    order.forEach(function (row) {
      var div = document.createElement('div');
      div.className = 'row';
      var lab = document.createElement('span');
      lab.className = 'row-label';
      lab.textContent = row;
      lab.setAttribute('aria-hidden', 'true');
      div.appendChild(lab);
      rows[row].forEach(function (st) {
        var b = document.createElement('button');
        var i = st.id.lastIndexOf('-');
        b.type = 'button';
        b.className = 'seat';
        b.textContent = i > 0 ? st.id.slice(i + 1) : st.id;
        b.setAttribute('data-seat', st.id);
        b.setAttribute('data-state', st.state);
        b.setAttribute('aria-label', 'Seat ' + st.id + (st.state === 'available' ? '' : ', ' + st.state));
        if (st.state === 'available') b.setAttribute('aria-pressed', chosen.indexOf(st.id) >= 0 ? 'true' : 'false');
        else b.disabled = true;
        div.appendChild(b);
      });
      map.appendChild(div);
    });
    if (focused) { var f = map.querySelector('[data-seat="' + focused + '"]:not(:disabled)'); if (f) f.focus(); }
  }
  function renderChosen() {
    $('limit').textContent = limit;
    if (ga) { $('chosen').textContent = ''; $('hold-btn').disabled = false; return; }
    Array.prototype.forEach.call($('seat-map').querySelectorAll('[aria-pressed]'), function (b) {
      b.setAttribute('aria-pressed', chosen.indexOf(b.getAttribute('data-seat')) >= 0 ? 'true' : 'false');
    });
    $('chosen').textContent = chosen.length ? 'Chosen: ' + chosen.join(', ') + ' (' + chosen.length + ' of up to ' + limit + ')' : 'No seats chosen yet.';
    $('hold-btn').disabled = !chosen.length;
  }
  $('seat-map').addEventListener('click', function (e) {
    var b = e.target.closest('button.seat');
    if (!b || b.disabled) return;
    var id = b.getAttribute('data-seat'), i = chosen.indexOf(id);
    if (i >= 0) chosen.splice(i, 1);
    else if (chosen.length >= limit) { $('chosen').textContent = 'You can choose up to ' + limit + ' seats at a time.'; return; }
    else chosen.push(id);
    renderChosen();
  });
  // Arrow keys move between available seats; up and down go to the nearest seat in the next row.
  $('seat-map').addEventListener('keydown', function (e) {
    var k = e.key, b = e.target.closest('button.seat');
    if (!b || ['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown'].indexOf(k) < 0) return;
    var rows = Array.prototype.slice.call($('seat-map').children);
    var cells = function (r) { return Array.prototype.slice.call(r.querySelectorAll('.seat')); };
    var row = b.parentNode, ri = rows.indexOf(row), ci = cells(row).indexOf(b), t = null, i, step;
    if (k === 'ArrowLeft' || k === 'ArrowRight') {
      step = k === 'ArrowLeft' ? -1 : 1;
      var cs = cells(row);
      for (i = ci + step; i >= 0 && i < cs.length && !t; i += step) if (!cs[i].disabled) t = cs[i];
    } else {
      step = k === 'ArrowUp' ? -1 : 1;
      for (i = ri + step; i >= 0 && i < rows.length && !t; i += step) {
        var c = cells(rows[i]);
        for (var d = 0; d < c.length && !t; d++) {
          if (c[ci - d] && !c[ci - d].disabled) t = c[ci - d];
          else if (c[ci + d] && !c[ci + d].disabled) t = c[ci + d];
        }
      }
    }
    e.preventDefault();
    if (t) t.focus();
  });

  $('hold-btn').addEventListener('click', hold);
  function hold() {
    var body = ga ? { quantity: parseInt($('qty').value, 10) || 1 } : { seats: chosen.slice() };
    $('hold-btn').disabled = true;
    note('seat-error', '');
    api('POST', '/v1/shows/' + enc(show) + '/holds', body, token).then(function (r) {
      if (r.status === 201 && r.data) {
        saved.hold = r.data;
        saved.hold.ticket = saved.ticket;
        saved.hold.show = show;
        save();
        chosen = [];
        return showHold();
      }
      var e = err(r), msg = (r.data && r.data.message) || '';
      if (e === 'seat_unavailable') {
        var taken = (r.data.seats || []);
        taken.forEach(function (id) { takenNow[id] = Date.now() + 3000; });
        chosen = chosen.filter(function (id) { return taken.indexOf(id) < 0; });
        note('seat-error', 'Sorry, ' + (taken.length === 1 ? 'this seat was' : 'these seats were') + ' just taken: ' +
          taken.join(', ') + '. Nothing was held; please choose again.');
        return loadSeats();
      }
      if (e === 'sold_out') { note('seat-error', 'Not enough places are left for that number.'); return loadSeats(); }
      if (r.status === 401 || r.status === 403) return ended();
      if (r.status === 409) return note('seat-error', msg || 'That did not work.', 'bad');
      if (r.status === 400) {
        var m = /at most (\d+)|1\.\.=(\d+)/.exec(msg);
        if (m) limit = parseInt(m[1] || m[2], 10);
        if (m && !ga) chosen = chosen.slice(0, limit);
        if (m && ga) $('qty').max = limit;
        note('seat-error', m ? 'You can hold up to ' + limit + (ga ? ' places' : ' seats') + ' at a time.' : 'That did not work: ' + msg);
        return renderChosen();
      }
      var ms = busy(r) ? retryMs(r) : 3000;
      note('seat-error', 'The box office is busy. Nothing was held; you can try again in ' + Math.ceil(ms / 1000) + ' s.');
      setTimeout(renderChosen, ms);
    });
  }
  function ended() {
    stopTimer();
    clearInterval(countdown);
    delete saved.hold;
    save();
    phase('ended');
    show1('');
    note('message', 'Your turn has ended, so nothing was held. You can join the line again.', 'bad');
    $('again').hidden = false;
  }
  $('again-btn').addEventListener('click', function () {
    delete saved.hold;
    delete saved.booking;
    save();
    $('again').hidden = true;
    show = null;
    note('message', '');
    enter();
  });

  // ---- hold and booking ----------------------------------------------------------------------
  function showHold() {
    var h = saved.hold;
    phase('hold');
    show1('hold');
    note('hold-error', '', 'bad');
    $('confirm-btn').disabled = false;
    $('release-btn').disabled = false;
    $('held-seats').textContent = h.quantity ? h.quantity + (h.quantity === 1 ? ' place' : ' places') : h.seats.join(', ');
    var end = Date.parse(h.expires_at), warned = false;
    clearInterval(countdown);
    var tick = function () {
      var left = Math.max(0, end - (Date.now() + skew)), s = Math.ceil(left / 1000);
      $('countdown').textContent = Math.floor(s / 60) + ':' + ('0' + (s % 60)).slice(-2);
      if (s <= 60 && !warned) { warned = true; live('One minute left to confirm.'); }
      if (left <= 0) {
        clearInterval(countdown);
        delete saved.hold;
        save();
        note('seat-error', 'Your hold ran out and the seats were released. Please choose again.');
        loadSeats();
      }
    };
    tick();
    countdown = setInterval(tick, 1000);
  }
  $('release-btn').addEventListener('click', function () {
    var h = saved.hold;
    $('release-btn').disabled = true;
    api('DELETE', '/v1/shows/' + enc(h.show) + '/holds/' + enc(h.hold_id), undefined, token).then(function (r) {
      if (busy(r)) { $('release-btn').disabled = false; return note('hold-error', 'The box office is busy; please try again.', 'bad'); }
      if (r.status === 401 || r.status === 403) return ended();
      clearInterval(countdown);
      delete saved.hold;
      save();
      loadSeats();
    });
  });
  $('confirm-btn').addEventListener('click', confirm);
  function confirm() {
    var h = saved.hold;
    if (!h) return;
    $('confirm-btn').disabled = true;
    $('release-btn').disabled = true;
    note('hold-error', 'Confirming…', '');
    api('POST', '/v1/shows/' + enc(h.show) + '/bookings', { hold_id: h.hold_id }, token).then(function (r) {
      if ((r.status === 201 || r.status === 200) && r.data) return booked(r.data);
      if (r.status === 503 && r.data && r.data.booking_id) {
        return booked({ booking_id: r.data.booking_id, show: h.show, seats: h.seats || [], quantity: h.quantity, status: 'pending' });
      }
      if (err(r) === 'hold_expired') {
        clearInterval(countdown);
        delete saved.hold;
        save();
        note('seat-error', 'Your hold ran out before the booking was made. Please choose again.');
        return loadSeats();
      }
      if (r.status === 401 || r.status === 403) return ended();
      if (busy(r)) {
        // The same request is safe to repeat: the booking id derives from the hold.
        var ms = retryMs(r);
        note('hold-error', 'The box office is busy. Trying again in ' + Math.ceil(ms / 1000) + ' s…', '');
        return setTimeout(confirm, ms);
      }
      $('confirm-btn').disabled = false;
      $('release-btn').disabled = false;
      note('hold-error', 'The booking did not go through: ' + ((r.data && r.data.message) || 'unknown error') + '.', 'bad');
    });
  }
  function booked(b) {
    clearInterval(countdown);
    saved.booking = { booking_id: b.booking_id, show: b.show, seats: b.seats || [], quantity: b.quantity, status: b.status };
    delete saved.hold;
    save();
    showBooking();
  }
  var bookingWait = 1000, missing = 0;
  function showBooking() {
    var b = saved.booking;
    phase('booking');
    show1('booking');
    $('booking-id').textContent = b.booking_id;
    var what = b.quantity ? b.quantity + (b.quantity === 1 ? ' place' : ' places') : (b.seats || []).join(', ');
    var st = $('booking-status');
    st.setAttribute('data-status', b.status);
    live('Booking ' + b.status + '.');
    if (b.status === 'confirmed') {
      st.className = 'notice good';
      st.textContent = 'Booking confirmed: ' + what + '. Enjoy the show.';
      $('again').hidden = false;
      return;
    }
    if (b.status === 'rejected') {
      st.className = 'notice bad';
      st.textContent = 'We are sorry: this booking was rejected because a seat in it had already been sold. ' +
        'These seats are not yours and you have not been charged for them.';
      $('again').hidden = false;
      return;
    }
    st.className = 'notice';
    st.textContent = 'Booking received (pending): ' + what + '. Waiting for it to be confirmed…';
    schedule(bookingWait, pollBooking);
  }
  function pollBooking() {
    api('GET', '/v1/bookings/' + enc(saved.booking.booking_id)).then(function (r) {
      bookingWait = Math.min(5000, bookingWait * 1.5);
      if (r.status === 200 && r.data) {
        ok();
        saved.booking.status = r.data.status;
        save();
        return showBooking();
      }
      if (busy(r)) return retryLater(r, pollBooking, 'the booking check');
      if (r.status === 404 && ++missing < 20) return schedule(bookingWait, pollBooking);
      note('message', 'We cannot find this booking. Keep the reference above and contact the seller.', 'bad');
    });
  }

  // ---- start ---------------------------------------------------------------------------------
  $('event-name').textContent = event ? event.charAt(0).toUpperCase() + event.slice(1).replace(/[-_]+/g, ' ') : 'Waiting room';
  document.title = $('event-name').textContent + ' · waiting room';
  if (!/^[a-z0-9][a-z0-9_-]{0,63}$/.test(event)) {
    phase('unknown');
    return note('message', 'There is no sale at this address. Please check the link.', 'bad');
  }
  $('ticket').textContent = saved.ticket || '—';
  if (saved.booking) return showBooking();
  if (saved.ticket) poll(); else enter();
})();
