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

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text === undefined || text === null ? '' : String(text);
  if (cls) td.className = cls;
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
  return ms >= 60000 ? Math.floor(ms / 60000) + 'm ' + Math.floor((ms % 60000) / 1000) + 's' : (ms / 1000).toFixed(1) + 's';
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
  const pol = state.policy || { namespaces: [], default: { match: '(default)', mode: '?' } };
  $('#policy-version').textContent = pol.version ? 'version ' + pol.version : '';
  fill('#policy', pol.namespaces.concat([Object.assign({}, pol.default, { match: '(default)' })]), (tr, r) => {
    cell(tr, r.match);
    cell(tr, r.mode, 'mode-' + r.mode);
    cell(tr, r.inserts);
    cell(tr, r.allowCollectionWrites ? 'allowed' : 'refused');
    cell(tr, r.maxCandidates, 'num');
    cell(tr, r.leaseMarginMS + ' ms', 'num');
  });
  $('#actions-note').textContent = state.actionsEnabled ? '' : 'force-release is disabled: no admin token is configured';
  $('#no-locks').hidden = state.locks.length > 0;
  fill('#locks', state.locks, (tr, l) => {
    tr.dataset.namespace = l.namespace;
    tr.dataset.id = l.idText;
    cell(tr, l.namespace);
    cell(tr, l.idText, 'id');
    cell(tr, l.ownerApp);
    cell(tr, l.ownerClient);
    cell(tr, l.ownerUser);
    cell(tr, l.ownerTag, 'id');
    cell(tr, l.token, 'num');
    cell(tr, seconds(l.timeLeftMS), 'num');
    cell(tr, l.waiters, 'num');
    cell(tr, l.lastError);
    const td = cell(tr, '');
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = 'Force-release';
    b.className = 'release';
    b.disabled = !state.actionsEnabled;
    b.addEventListener('click', () => ask(l));
    td.appendChild(b);
  });
  fill('#decisions', state.decisions || [], (tr, d) => {
    cell(tr, d.rule);
    cell(tr, d.decision);
    cell(tr, d.reason);
    cell(tr, d.count, 'num');
  });
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
      method: 'POST', headers, body: JSON.stringify({ namespace: lock.namespace, key: lock.key, reason }),
    });
    body = await res.json().catch(() => ({}));
  } catch (e) {
    say('force-release failed: ' + e.message, true);
    return;
  }
  if (res.ok) {
    say('released ' + lock.namespace + ' _id ' + lock.idText + ' (was held by ' + (body.before && body.before.ownerApp) + ')', false);
  } else if (res.status === 401) {
    say('refused: the admin token is missing or wrong', true);
  } else {
    say('refused (' + res.status + '): ' + (body.error || res.statusText), true);
  }
  refresh();
}

document.addEventListener('DOMContentLoaded', () => {
  $('#auth').addEventListener('submit', (e) => e.preventDefault());
  $('#release-dialog').addEventListener('close', () => {
    const lock = pending;
    pending = null;
    if ($('#release-dialog').returnValue === 'ok' && lock) release(lock, $('#reason').value);
  });
  refresh();
  setInterval(refresh, 2000);
});
