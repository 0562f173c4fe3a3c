'use strict';
// Scenarios of the Node.js helper against a running lockgate, driven by
// client/conformance (Go). Prints one JSON line per scenario with what it
// observed; the Go test judges. Environment: LOCKGATE_URI, DIRECT_URI,
// CUT_URL (POST cuts the lock store's connection), DB (enforced).

const lockgate = require('..');

const { LOCKGATE_URI: URI, DIRECT_URI: DIRECT, CUT_URL: CUT, DB } = process.env;
const out = (c, o) => console.log(JSON.stringify({ case: c, ...o }));
const info = (e) => ({ class: e.constructor.name, code: e.code, reason: e.reason, holder: e.holder, msg: e.message });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const timeout = (p, ms) => Promise.race([p.then(() => true), sleep(ms).then(() => false)]);

async function main() {
  const holder = lockgate.connect(URI, 'node-holder');
  const waiter = lockgate.connect(URI, 'node-waiter');
  const ch = holder.db(DB).collection('busy');
  const cw = waiter.db(DB).collection('busy');

  {
    const hs = holder.startSession();
    const ws = waiter.startSession();
    const lk = await lockgate.tryAcquire(hs, ch, [7, 8]);
    try { await lockgate.tryAcquire(ws, cw, [8]); out('busy', { error: null }); } catch (e) { out('busy', { error: info(e), holderTag: lk.holderTag }); }
    const t0 = Date.now();
    try { await lockgate.acquire(ws, cw, [8], { waitMS: 300 }); out('timeout', { error: null }); } catch (e) { out('timeout', { error: info(e), elapsedMS: Date.now() - t0 }); }
    await lk.release();
    const lk2 = await lockgate.tryAcquire(ws, cw, [8]);
    out('after_release', { token: String(lk2.token) });
    await lk2.release();
    await hs.endSession();
    await ws.endSession();
  }

  {
    const coll = holder.db(DB).collection('withlock');
    const s = holder.startSession();
    let firstToken = null; let raised = null; let outside = null;
    try {
      await lockgate.withLock(s, coll, ['o1'], {}, async (lk) => {
        firstToken = String(lk.token);
        await coll.updateOne({ _id: 'o1' }, { $set: { state: 'charging' } }, { upsert: true, session: s });
        try { await coll.updateOne({ _id: 'o1' }, { $set: { state: 'x' } }); } catch (e) { outside = e.code; }
        throw new Error('payment provider said no');
      });
    } catch (e) { raised = e.message; }
    const s2 = holder.startSession();
    const nxt = await lockgate.tryAcquire(s2, coll, ['o1']);
    out('with_lock', { raised, outsideCode: outside, firstToken, nextToken: String(nxt.token), lastError: nxt.locks[0].lastError || null });
    await nxt.release();
    await s.endSession();
    await s2.endSession();
  }

  {
    const s = holder.startSession();
    const lk = await lockgate.acquire(s, holder.db(DB).collection('refused'), [1], { leaseMS: 10000, renewEveryMS: 200 });
    await holder.db(DB).command({ releaseLock: 'refused' }, { session: s });
    const fired = await timeout(lk.lost, 5000);
    let rel = null;
    try { await lk.release(); } catch (e) { rel = e.constructor.name; }
    out('refused_renewal', { lost: fired, error: lk.error ? lk.error.constructor.name : null, reason: lk.error ? lk.error.reason : null, release: rel, aborted: lk.signal.aborted });
    await s.endSession();
  }

  {
    const s = holder.startSession();
    let raised = null; let aborted = false;
    try {
      await lockgate.withLock(s, holder.db(DB).collection('lostwork'), [1], { leaseMS: 10000, renewEveryMS: 200 }, async (lk, signal) => {
        await holder.db(DB).command({ releaseLock: 'lostwork' }, { session: s });
        await timeout(lk.lost, 5000);
        aborted = signal.aborted;
      });
    } catch (e) { raised = e.constructor.name; }
    out('lost_in_block', { raised, aborted });
    await s.endSession();
  }

  {
    const direct = lockgate.connect(DIRECT, 'node-direct');
    const s = direct.startSession();
    try { await lockgate.tryAcquire(s, direct.db(DB).collection('x'), [1]); out('not_protected', { error: null }); } catch (e) { out('not_protected', { error: info(e) }); }
    await s.endSession();
    await direct.close();
    try { await lockgate.tryAcquire(undefined, ch, [1]); out('no_session', { error: null }); } catch (e) { out('no_session', { error: info(e) }); }
  }

  {
    const LEASE = 4000;
    const worker = lockgate.connect(URI, 'node-worker');
    const wc = worker.db(DB).collection('renew');
    const s = worker.startSession();
    const other = holder.startSession();
    const lk = await lockgate.acquire(s, wc, ['job-1'], { leaseMS: LEASE });
    const tok = lk.token;
    let lostEarly = false;
    lk.lost.then(() => { lostEarly = true; });
    const t0 = Date.now();
    let writes = 0; let writeError = null;
    while (Date.now() - t0 < 3 * LEASE + LEASE / 3 && !lostEarly) {
      try {
        await wc.updateOne({ _id: 'job-1' }, { $set: { n: writes, fence: tok } }, { upsert: true, session: s });
        writes++;
      } catch (e) { writeError = e.message; break; }
      await sleep(100);
    }
    const heldMS = Date.now() - t0;
    let otherError = null;
    try { await lockgate.tryAcquire(other, holder.db(DB).collection('renew'), ['job-1']); } catch (e) { otherError = e.constructor.name; }
    const early = lostEarly;
    const tokenSame = typeof tok === 'bigint' && lk.token === tok;
    await fetch(CUT, { method: 'POST' });
    const cut = Date.now();
    const fired = await timeout(lk.lost, 3 * LEASE);
    out('renew_then_cut', {
      leaseMS: LEASE, heldMS, writes, writeError, otherError, lostEarly: early, tokenSame, lost: fired,
      lostAfterMS: Date.now() - cut, error: lk.error ? lk.error.constructor.name : null, errorText: lk.error ? lk.error.message : null,
    });
    process.exit(0); // the lock store is gone: do not wait for the release and endSessions
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
