'use strict';
// lockgate's operator console. Every value from the server is set with
// textContent, never as HTML: application names and _id values are chosen
// by clients. The admin token stays in this page's memory only.
// An _id is never parsed here nor rebuilt: JSON.parse rounds integers past
// 2^53 and moves object keys that look like array indexes first, so a
// parsed id can name another lock. Each row shows the server's text
// (idText) and releases by the server's key (key), both strings.

const $ = (sel) => document.querySelector(sel);
let pending = null; // the lock the release dialog is about

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function cell(tr, text, cls) {
  const td = el('td', text, cls);
  tr.appendChild(td);
  return td;
}

function fill(table, rows, render) {
  const body = $(table + ' tbody');
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement('tr');
    render(tr, r);
    body.appendChild(tr);
  }
}

function seconds(ms) {
  if (ms >= 3600000) return Math.floor(ms / 3600000) + 'h ' + Math.floor((ms % 3600000) / 60000) + 'm';
  return ms >= 60000 ? Math.floor(ms / 60000) + 'm ' + Math.floor((ms % 60000) / 1000) + 's' : (ms / 1000).toFixed(1) + 's';
}

// clock is an RFC 3339 time as HH:MM:SS UTC, read from the text (no Date:
// the page's own time zone and clock do not enter it).
function clock(iso) {
  const m = /T(\d\d:\d\d:\d\d)/.exec(iso || '');
  return m ? m[1] : '';
}

// Settings by the strictest mode a rule applies (its own, or otherClients'
// under a rollout): a rule in off checks nothing, the fence and capped
// inserts act only in enforce. Hidden settings do not apply.
const modeRank = { off: 0, audit: 1, enforce: 2 };
function settingsOf(r) {
  const mode = [r.mode, r.otherClients].filter((m) => m in modeRank)
    .reduce((a, b) => (modeRank[b] > modeRank[a] ? b : a), 'off');
  const out = [];
  if (mode !== 'off') {
    out.push(['inserts', r.inserts]);
    out.push(['collection writes', r.allowCollectionWrites ? 'allowed' : 'refused']);
    if (mode === 'enforce') out.push(['capped inserts', r.allowCappedInserts ? 'allowed' : 'refused']);
    out.push(['max candidates', r.maxCandidates]);
    out.push(['lease margin', r.leaseMarginMS + ' ms']);
    if (mode === 'enforce') out.push(['fence', r.fenceField ? r.fence + ' (' + r.fenceField + ')' : r.fence]);
  }
  out.push(['missing collection', r.refuseLocksOnMissingCollection ? 'acquireLock refused' : 'acquireLock warns']);
  return out;
}

const schemeFields = ['field', 'timeField', 'actorField', 'expiresField', 'holderField', 'holder', 'collection', 'tsField', 'aidField'];
function schemeCell(td, s) {
  if (!s) {
    td.textContent = 'lockgate';
    td.classList.add('muted');
    return;
  }
  td.appendChild(el('strong', s.type, 'scheme-type'));
  for (const k of schemeFields) {
    if (s[k]) td.appendChild(el('div', k + ': ' + s[k], 'kv'));
  }
  if (s.leaseMS) td.appendChild(el('div', 'lease: ' + s.leaseMS + ' ms', 'kv'));
}

function renderPolicy(pol) {
  $('#policy-version').textContent = pol.version ? 'version ' + pol.version : '';
  fill('#policy', pol.namespaces.concat([Object.assign({}, pol.default, { match: '(default)' })]), (tr, r) => {
    tr.dataset.match = r.match;
    cell(tr, r.match);
    cell(tr, r.mode, 'mode mode-' + r.mode);
    schemeCell(cell(tr, null, 'scheme'), r.scheme);
    const td = cell(tr, null, 'settings');
    for (const [k, v] of settingsOf(r)) {
      const d = el('div', k + ': ' + v, 'kv');
      d.dataset.key = k;
      td.appendChild(d);
    }
    const cl = cell(tr, null, 'clients');
    if (r.clients) {
      for (const [k, label] of [['appNames', 'applications'], ['users', 'users'], ['networks', 'networks']]) {
        if (r.clients[k] && r.clients[k].length) cl.appendChild(el('div', label + ': ' + r.clients[k].join(', '), 'kv'));
      }
      cl.appendChild(el('div', 'everyone else: ' + r.otherClients, 'kv'));
    } else {
      cl.textContent = 'all';
      cl.className = 'clients muted';
    }
  });
}

function renderLocks(state) {
  $('#actions-note').textContent = state.actionsEnabled ? '' : 'force-release is disabled: no admin token is configured';
  $('#no-locks').hidden = state.locks.length > 0;
  fill('#locks', state.locks, (tr, l) => {
    const h = l.holder || {};
    tr.dataset.namespace = l.namespace;
    tr.dataset.id = l.idText;
    cell(tr, l.namespace, 'ns');
    cell(tr, l.idText, 'id');
    cell(tr, l.mirror ? 'mirrors ' + l.mirror.scheme + ' (' + l.mirror.rule + ')' : '', 'mirror');
    cell(tr, h.app, 'app');
    cell(tr, h.client, 'client');
    cell(tr, h.user, 'user');
    cell(tr, h.tag, 'id tag');
    cell(tr, l.token, 'num token');
    cell(tr, l.since ? clock(l.since) + ' (' + seconds(l.heldForMS) + ' ago)' : '', 'num since');
    cell(tr, seconds(l.timeLeftMS), 'num left');
    const w = cell(tr, null, 'waiters');
    w.appendChild(el('span', l.waiters, 'count'));
    if (l.waiting.length) {
      const ul = el('ol', null, 'waiting');
      for (const x of l.waiting) {
        const who = [x.app || '(no application name)', x.client, x.user].filter(Boolean).join(', ');
        ul.appendChild(el('li', who + ' — waiting since ' + clock(x.since) + ' (' + seconds(x.waitingMS) + ')'));
      }
      w.appendChild(ul);
    }
    cell(tr, l.lastError, 'error');
    const td = cell(tr, null, 'action');
    const b = el('button', 'Force-release', 'release');
    b.type = 'button';
    b.disabled = !state.actionsEnabled;
    b.addEventListener('click', () => ask(l));
    td.appendChild(b);
  });
}

function renderRates(rates) {
  const head = $('#decisions thead tr');
  head.replaceChildren();
  for (const t of ['rule', 'decision', 'reason']) head.appendChild(el('th', t));
  rates.minutes.forEach((m, i) => {
    head.appendChild(el('th', clock(m).slice(0, 5) + (i === rates.minutes.length - 1 ? ' (now)' : ''), 'num'));
  });
  head.appendChild(el('th', 'since start', 'num'));
  $('#no-decisions').hidden = rates.series.length > 0;
  fill('#decisions', rates.series, (tr, s) => {
    tr.dataset.rule = s.rule;
    tr.dataset.decision = s.decision;
    tr.dataset.reason = s.reason;
    cell(tr, s.rule);
    cell(tr, s.decision, 'decision-' + s.decision);
    cell(tr, s.reason);
    s.perMinute.forEach((n, i) => {
      cell(tr, n, 'num minute' + (n ? '' : ' zero') + (i === s.perMinute.length - 1 ? ' now' : ''));
    });
    cell(tr, s.total, 'num total');
  });
}

function renderAudit(on) {
  $('#audit-off').hidden = on;
  $('#audit-form').hidden = !on;
  if (!on) $('#audit-records').hidden = true;
}

async function refresh() {
  let state;
  try {
    const res = await fetch('state', { cache: 'no-store' });
    state = await res.json();
    if (!res.ok) throw new Error(state.error || res.statusText);
  } catch (e) {
    $('#status').textContent = 'cannot read state: ' + e.message;
    $('#status').className = 'error';
    return;
  }
  $('#status').textContent = 'lock store time ' + state.now;
  $('#status').className = '';
  renderPolicy(state.policy || { namespaces: [], default: { match: '(default)', mode: '?' } });
  renderLocks(state);
  renderRates(state.rates || { minutes: [], series: [] });
  renderAudit(!!state.audit);
}

function ask(lock) {
  pending = lock;
  $('#release-what').textContent = lock.namespace + ' _id ' + lock.idText;
  $('#reason').value = '';
  $('#release-dialog').showModal();
}

function say(text, isError) {
  $('#result').textContent = text;
  $('#result').className = isError ? 'error' : '';
}

async function release(lock, reason) {
  const token = $('#token').value;
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = 'Bearer ' + token;
  let res; let body;
  try {
    res = await fetch('../locks/release', {
      method: 'POST', headers, body: JSON.stringify({ namespace: lock.namespace, key: lock.key, token: lock.token, reason }),
    });
    body = await res.json().catch(() => ({}));
  } catch (e) {
    say('force-release failed: ' + e.message, true);
    return;
  }
  if (res.ok) {
    const h = (body.before && body.before.holder) || {};
    say('released ' + lock.namespace + ' _id ' + lock.idText + ' (was held by ' + h.app + ', holder tag ' + h.tag + ')', false);
  } else if (res.status === 401) {
    say('refused: the admin token is missing or wrong', true);
  } else {
    say('refused (' + res.status + '): ' + (body.error || res.statusText), true);
  }
  refresh();
}

// exactJSON parses a reply keeping every number as the text the server
// wrote: fencing tokens use 64 bits, past a JavaScript number.
function exactJSON(text) {
  return JSON.parse(text, (k, v, ctx) => (typeof v === 'number' ? (ctx && ctx.source) || String(v) : v));
}

async function history(e) {
  e.preventDefault();
  const ns = $('#audit-ns').value.trim();
  const id = $('#audit-id').value.trim();
  const holder = $('#audit-holder').value.trim();
  const note = $('#audit-note');
  note.className = '';
  let params;
  if (holder) {
    params = new URLSearchParams({ holder });
  } else if (ns && id) {
    params = new URLSearchParams({ ns, id });
  } else {
    note.textContent = 'name a namespace and an _id, or a holder tag';
    note.className = 'error';
    return;
  }
  note.textContent = 'reading the trail…';
  let res; let body;
  try {
    res = await fetch('../audit/history?' + params, { cache: 'no-store' });
    // A lockgate from before the holder parameter knew it as session.
    if (holder && res.status === 400) {
      res = await fetch('../audit/history?' + new URLSearchParams({ session: holder }), { cache: 'no-store' });
    }
    body = exactJSON(await res.text());
  } catch (err) {
    note.textContent = 'cannot read the history: ' + err.message;
    note.className = 'error';
    return;
  }
  if (!res.ok) {
    note.textContent = 'refused (' + res.status + '): ' + (body.error || res.statusText);
    note.className = 'error';
    return;
  }
  const recs = body.records || [];
  note.textContent = recs.length + ' record' + (recs.length === 1 ? '' : 's') + (body.truncated ? ' (the first ones only: narrow the query)' : '');
  $('#audit-records').hidden = false;
  fill('#audit-records', recs, (tr, r) => {
    tr.dataset.kind = r.kind;
    cell(tr, (r.time || '').replace('T', ' ').replace(/(\.\d{3})\d*Z$/, '$1Z'), 'num');
    cell(tr, r.kind);
    cell(tr, r.op);
    cell(tr, r.ns);
    cell(tr, (r.ids || []).join(', '), 'id');
    cell(tr, r.verdict, 'verdict-' + r.verdict);
    cell(tr, r.reason);
    cell(tr, r.app);
    cell(tr, r.user);
    cell(tr, r.client);
    cell(tr, r.holder || r.session, 'id');
    cell(tr, (r.tokens || []).join(', '), 'num');
  });
}

document.addEventListener('DOMContentLoaded', () => {
  $('#auth').addEventListener('submit', (e) => e.preventDefault());
  $('#audit-form').addEventListener('submit', history);
  $('#release-dialog').addEventListener('close', () => {
    const lock = pending;
    pending = null;
    if ($('#release-dialog').returnValue === 'ok' && lock) release(lock, $('#reason').value);
  });
  refresh();
  setInterval(refresh, 2000);
});
