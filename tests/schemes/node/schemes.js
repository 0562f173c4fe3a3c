// An application's own advisory locking, written as a Node.js application
// writes it: the same flows, arguments and output as ../pymongo/schemes.py
// (read its docstring); the Go test judges.
//
// Usage: node schemes.js <scheme> <mode> <uri[,uri2]> <direct-uri> <db> <coll> [K M rogue]
//
// The driver is the one installed for tests/compat (shared, read only).
'use strict';

const path = require('path');

const modules = path.join(__dirname, '..', '..', 'compat', 'node', 'node_modules');
const { MongoClient, MongoServerError } = require(path.join(modules, 'mongodb'));

const HOT = [1, 2, 3];
// The rules' leaseMS, from schemes_test.go, as in schemes.py.
const LEASE_MS = Number(process.env.LOCKGATE_TEST_LEASE_MS);
if (!(LEASE_MS > 0)) throw new Error('LOCKGATE_TEST_LEASE_MS is not set (schemes_test.go sets it)');
// lockgate's policy.leaseMarginMS, as in schemes.py.
const MARGIN_MS = Number(process.env.LOCKGATE_TEST_LEASE_MARGIN_MS);
if (!(MARGIN_MS >= 0)) throw new Error('LOCKGATE_TEST_LEASE_MARGIN_MS is not set (schemes_test.go sets it)');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const errName = (e) => `${e.constructor.name}/${e.code}`;

// Scheme 1: LockId + LockTime (the C# original, call for call).
class HolderFields {
  constructor(coll) { this.coll = coll; }

  async acquire(id, me, seen) {
    let doc;
    try {
      doc = await this.coll.findOneAndUpdate(
        { _id: id, $or: [{ LockId: null }, { LockTime: { $lt: new Date(Date.now() - LEASE_MS) } }] },
        { $set: { LockId: me, LockTime: new Date() } },
        { upsert: true, returnDocument: 'after' });
    } catch (e) {
      if (e instanceof MongoServerError && e.code === 11000) {
        seen.add(`acquire_busy:${errName(e)}`);
        return false;
      }
      throw e;
    }
    const ok = doc !== null && doc.LockId === me;
    seen.add(`acquire:${ok ? 'locked' : 'returned_other'}`);
    return ok;
  }

  async write(id, me, n) {
    return (await this.coll.updateOne({ _id: id, LockId: me }, { $set: { n } })).modifiedCount;
  }

  async release(id, me) {
    await this.coll.updateOne({ _id: id, LockId: me }, { $set: { LockId: null, LockTime: null } });
  }
}

// Scheme 2: Lock: {actor, expiresAt, error}.
class LockDocument {
  constructor(coll) { this.coll = coll; }

  async acquire(id, me, seen, leaseMS = LEASE_MS * 10 / 3) {
    const t = new Date();
    const r = await this.coll.updateOne(
      { _id: id, $or: [{ 'Lock.actor': null }, { 'Lock.expiresAt': { $lt: t } }] },
      { $set: { Lock: { actor: me, expiresAt: new Date(t.getTime() + leaseMS), error: null } } });
    seen.add(`acquire:matched=${r.matchedCount},modified=${r.modifiedCount}`);
    return r.modifiedCount === 1;
  }

  async acquireAll(ids, me, seen) {
    const taken = [];
    for (const id of [...ids].sort()) {
      if (!(await this.acquire(id, me, seen))) {
        for (const t of taken.reverse()) await this.release(t, me); // rollback
        return false;
      }
      taken.push(id);
    }
    return true;
  }

  async write(id, me, n) {
    return (await this.coll.updateOne({ _id: id, 'Lock.actor': me }, { $set: { n } })).modifiedCount;
  }

  async release(id, me, error) {
    if (error === undefined) {
      await this.coll.updateOne({ _id: id, 'Lock.actor': me }, { $set: { Lock: null } });
    } else {
      await this.coll.updateOne({ _id: id, 'Lock.actor': me }, { $set: { 'Lock.actor': null, 'Lock.error': error } });
    }
  }
}

// Scheme 3: a boolean flag.
class Flag {
  constructor(coll) { this.coll = coll; }

  async acquire(id, me, seen) {
    const r = await this.coll.updateOne({ _id: id, locked: false }, { $set: { locked: true } });
    seen.add(`acquire:matched=${r.matchedCount},modified=${r.modifiedCount}`);
    return r.modifiedCount === 1;
  }

  async write(id, me, n) {
    return (await this.coll.updateOne({ _id: id }, { $set: { n } })).modifiedCount;
  }

  async release(id) {
    await this.coll.updateOne({ _id: id }, { $set: { locked: false } });
  }
}

// Scheme 4: a lock collection "<coll>.lock" of records {_id, ts, aid}.
class LockCollection {
  constructor(db, coll, upsert = false) {
    this.coll = coll;
    this.locks = db.collection(`${coll.collectionName}.lock`);
    this.upsert = upsert;
  }

  async acquire(id, me, seen) {
    if (this.upsert) {
      let r;
      try {
        r = await this.locks.updateOne({ _id: id }, { $setOnInsert: { ts: new Date(), aid: me } }, { upsert: true });
      } catch (e) {
        // Two upserts racing to insert: the loser is busy (MongoDB
        // documents this for concurrent upserts too).
        if (e instanceof MongoServerError && e.code === 11000) {
          seen.add('acquire_upsert:duplicate');
          return false;
        }
        throw e;
      }
      const ok = r.upsertedId !== null && r.upsertedId !== undefined;
      seen.add(`acquire_upsert:${ok ? 'inserted' : `matched=${r.matchedCount}`}`);
      return ok;
    }
    try {
      await this.locks.insertOne({ _id: id, ts: new Date(), aid: me });
    } catch (e) {
      if (e instanceof MongoServerError && e.code === 11000) {
        seen.add(`acquire_busy:${errName(e)}`);
        return false;
      }
      throw e;
    }
    seen.add('acquire:inserted');
    return true;
  }

  async write(id, me, n) {
    return (await this.coll.updateOne({ _id: id }, { $set: { n } })).modifiedCount;
  }

  async release(id, me, byAid = false) {
    if (byAid) await this.locks.deleteMany({ aid: me });
    else await this.locks.deleteOne({ _id: id });
  }
}

const SCHEMES = { holderFields: HolderFields, lockDocument: LockDocument, flag: Flag };

async function seed(coll, scheme, db) {
  await coll.deleteMany({});
  if (scheme === 'lockCollection') await db.collection(`${coll.collectionName}.lock`).deleteMany({});
  for (const id of HOT) {
    const d = { _id: id, n: 0 };
    if (scheme === 'flag') d.locked = false;
    else if (scheme === 'lockDocument') d.Lock = null;
    else { d.LockId = null; d.LockTime = null; }
    await coll.insertOne(d);
  }
}

// How long a worker tries to take one lock before it gives up: far longer
// than any holder keeps it, so that reaching it means the lock is never
// coming back (a flag left set by a worker that died with it: the scheme
// leaves its recovery to whoever notices, and these workers do not).
// Giving up ends the worker with an error naming the lock, and the script
// still prints what every worker saw, instead of spinning until
// schemes_test.go kills it with nothing to show.
const GIVE_UP_MS = Math.max(30000, 20 * LEASE_MS);

class GaveUp extends Error {}

// A flag holder's call refused after it may have held the lock for its
// whole lease; the run abandoned because of one (work, as in schemes.py).
class LeaseLost extends Error {
  constructor(heldMS) {
    super(`refused after ${heldMS} ms held`);
    this.heldMS = heldMS;
  }
}
class Abandoned extends Error {}

let tries = 0;

async function spin(tryOnce, what, abandon) {
  const deadline = Date.now() + GIVE_UP_MS;
  for (;;) {
    tries++;
    if (await tryOnce()) return;
    if (abandon.set) throw new Abandoned();
    if (Date.now() > deadline) throw new GaveUp(`gave up taking the lock on ${what} after ${GIVE_UP_MS / 1000} s: its holder never let it go`);
    await sleep(1);
  }
}

async function work(scheme, uri, direct, db, cname, k, m, rogue) {
  const uris = uri.split(',');
  const clients = uris.map((u) => new MongoClient(u, { appName: 'scheme-worker', retryWrites: false }));
  const dc = new MongoClient(direct);
  await seed(dc.db(db).collection(cname), scheme, dc.db(db));
  const seen = new Set();
  const errors = [];
  let stop = false;
  // A flag holder slowed past its lease stops the run, to be run again
  // under a longer lease, as in schemes.py.
  const leaseLost = [];
  const abandon = { set: false };

  const worker = async (w) => {
    const me = `w${w}-${Math.random().toString(16).slice(2)}`;
    const coll = clients[w % clients.length].db(db).collection(cname);
    const s = scheme === 'lockCollection'
      ? new LockCollection(clients[w % clients.length].db(db), coll, w % 2 === 1)
      : new SCHEMES[scheme](coll);
    try {
      for (let i = 0; i < m; i++) {
        if (scheme === 'lockDocument') {
          const ids = [HOT[(w + i) % 2], 3];
          await spin(() => s.acquireAll(ids, me, seen), `_id ${ids}`, abandon);
          for (const id of ids) {
            const n = (await coll.findOne({ _id: id })).n;
            if ((await s.write(id, me, n + 1)) !== 1) seen.add('write:not_applied');
          }
          for (const id of [...ids].reverse()) await s.release(id, me);
          continue;
        }
        // Workers 0 and 1 want the same document every round (schemes.py).
        const id = HOT[(Math.floor(w / 2) + i) % HOT.length];
        let sent = 0;
        await spin(() => { sent = performance.now(); return s.acquire(id, me, seen); }, `_id ${id}`, abandon);
        try {
          const n = (await coll.findOne({ _id: id })).n;
          if ((await s.write(id, me, n + 1)) !== 1) seen.add('write:not_applied');
          if (scheme === 'lockCollection') await s.release(id, me, i % 2 === 1);
          else await s.release(id, me);
        } catch (e) {
          const held = performance.now() - sent;
          if (scheme === 'flag' && e instanceof MongoServerError && held >= LEASE_MS - MARGIN_MS) throw new LeaseLost(Math.floor(held));
          throw e;
        }
      }
    } catch (e) {
      if (e instanceof LeaseLost) {
        leaseLost.push(e.heldMS);
        abandon.set = true;
        return;
      }
      if (e instanceof Abandoned) return;
      seen.add(`worker_error:${errName(e)}`);
      errors.push(`worker ${w}: ${e}`);
      // Its flag may stay set: its peers stop too (schemes.py).
      abandon.set = true;
    }
  };

  const landed = { update: 0, delete: 0 };
  let rogueTries = 0;
  const refused = new Set();
  // The age in ms (at the reply) of each lock record the rogue deleted:
  // abandoned ones, and live ones (stolen).
  const takeovers = [];
  const stolen = [];
  const rogueLoop = async () => {
    const rc = new MongoClient(uris[0], { appName: 'scheme-rogue', retryWrites: false });
    const rcoll = rc.db(db).collection(cname);
    const rlocks = rc.db(db).collection(`${cname}.lock`);
    let i = 0;
    while (!stop) {
      const id = HOT[i % HOT.length];
      i++;
      rogueTries = i;
      try {
        if (scheme === 'lockCollection' && i % 5 === 1) {
          // Steal a lock: delete someone's record. The scheme lets anyone
          // delete an abandoned one (ts older than the lease: what a TTL
          // index deletes), which a worker slowed past its lease by a
          // loaded machine leaves: the deleted record comes back, and one
          // whose lease had not ended by the reply was stolen.
          const rec = await rlocks.findOneAndDelete({ _id: id });
          if (rec) {
            const age = Date.now() - rec.ts.getTime();
            if (age < LEASE_MS) {
              landed.delete++;
              stolen.push(age);
            } else {
              takeovers.push(age);
            }
          }
        } else if (scheme === 'lockCollection' && i % 5 === 2) {
          if ((await rlocks.updateOne({ _id: id }, { $set: { ts: new Date() } })).modifiedCount) landed.update++;
        } else if (i % 5 === 0) {
          const r = await rcoll.deleteOne({ _id: id });
          if (r.deletedCount) {
            landed.delete++;
            await rcoll.insertOne(scheme === 'flag' ? { _id: id, n: 0, locked: false } : { _id: id, n: 0 });
          }
        } else {
          const r = await rcoll.updateOne({ _id: id }, { $inc: { n: 1000 } });
          if (r.modifiedCount) landed.update++;
        }
      } catch (e) {
        if (e instanceof MongoServerError) refused.add(`${e.code}/${e.codeName}`);
        else throw e;
      }
      // Paced, as in schemes.py.
      await sleep(10);
    }
    await rc.close();
  };

  const rp = rogue ? rogueLoop() : Promise.resolve();
  await Promise.all(Array.from({ length: k }, (_, w) => worker(w)));
  stop = true;
  await rp;
  const counters = {};
  for (const d of await dc.db(db).collection(cname).find({}, { sort: { _id: 1 } }).toArray()) counters[String(d._id)] = d.n;
  console.log(JSON.stringify({
    counters, rogueLanded: landed, rogueTakeovers: takeovers, rogueStolen: stolen, rogueRefused: [...refused].sort(), outcomes: [...seen].sort(), errors: errors.slice(0, 5), leaseLost, tries, rogueTries,
  }));
  for (const c of clients) await c.close();
  await dc.close();
}

async function takeover(scheme, uri, direct, db, cname) {
  const out = {};
  const a = new MongoClient(uri, { appName: 'scheme-crashed', retryWrites: false });
  const b = new MongoClient(uri, { appName: 'scheme-successor', retryWrites: false });
  const ca = a.db(db).collection(cname);
  const cb = b.db(db).collection(cname);
  const dc = new MongoClient(direct);
  await seed(dc.db(db).collection(cname), scheme, dc.db(db));
  const seen = new Set();
  const refusedOr = async (f) => {
    try { return await f(); } catch (e) { if (e instanceof MongoServerError) return `refused/${e.code}`; throw e; }
  };
  // Both connected before A takes its lock: the lock's time is taken
  // before the write is sent, so a first connection made on the way
  // would count into A's lease.
  await a.db('admin').command({ ping: 1 });
  await b.db('admin').command({ ping: 1 });
  const start = performance.now();
  // How long A's lock had lived, at most, when B's early steps were
  // answered: if not less than A's lease, A's lock may have ended before
  // them, and their outcome says nothing (schemes_test.go runs the
  // takeover again).
  const earlyDone = () => { out.early_ms = Math.floor(performance.now() - start); };
  if (scheme === 'holderFields') {
    out.a_acquire = await new HolderFields(ca).acquire(1, 'A', seen);
    out.b_acquire_early = await new HolderFields(cb).acquire(1, 'B', seen);
    earlyDone();
    await sleep(LEASE_MS + 500);
    out.a_write_after_lease = await new HolderFields(ca).write(1, 'A', 5);
    await sleep(400);
    out.b_acquire_after_lease = await new HolderFields(cb).acquire(1, 'B', seen);
    out.a_write_after_takeover = await new HolderFields(ca).write(1, 'A', 99);
    out.b_write = await new HolderFields(cb).write(1, 'B', 7);
  } else if (scheme === 'lockDocument') {
    out.a_acquire = await new LockDocument(ca).acquire(1, 'A', seen, LEASE_MS * 2 / 3);
    out.b_acquire_early = await new LockDocument(cb).acquire(1, 'B', seen);
    earlyDone();
    await sleep(LEASE_MS);
    out.a_write_after_expiry = await new LockDocument(ca).write(1, 'A', 5);
    await sleep(400);
    out.b_acquire_after_expiry = await new LockDocument(cb).acquire(1, 'B', seen);
    out.a_write_after_takeover = await new LockDocument(ca).write(1, 'A', 99);
    out.b_write = await new LockDocument(cb).write(1, 'B', 7);
    await new LockDocument(cb).release(1, 'B', 'failed halfway');
    out.after_error_release = (await cb.findOne({ _id: 1 })).Lock;
    out.c_acquire_after_error_release = await new LockDocument(ca).acquire(1, 'C', seen);
  } else if (scheme === 'lockCollection') {
    const la = new LockCollection(a.db(db), ca);
    const lb = new LockCollection(b.db(db), cb);
    out.a_acquire = await la.acquire(1, 'A', seen);
    out.b_acquire_early = await lb.acquire(1, 'B', seen);
    out.b_acquire_upsert_early = await new LockCollection(b.db(db), cb, true).acquire(1, 'B', seen);
    out.b_delete_early = await refusedOr(async () => (await lb.locks.deleteOne({ _id: 1 })).deletedCount);
    out.b_refresh_early = await refusedOr(async () => (await lb.locks.updateOne({ _id: 1 }, { $set: { ts: new Date() } })).modifiedCount);
    earlyDone();
    await sleep(LEASE_MS + 500);
    // What a TTL index on ts does on MongoDB (FerretDB has none).
    await dc.db(db).collection(`${cname}.lock`).deleteOne({ _id: 1, ts: { $lt: new Date(Date.now() - LEASE_MS) } });
    out.b_acquire_after_ttl = await lb.acquire(1, 'B', seen);
    out.a_write_after_takeover = await refusedOr(() => la.write(1, 'A', 99));
    out.b_write = await lb.write(1, 'B', 7);
    out.b_release_all = (await lb.locks.deleteMany({ aid: 'B' })).deletedCount;
    out.a_acquire_after_release = await la.acquire(1, 'A', seen);
  } else {
    out.a_acquire = await new Flag(ca).acquire(1, 'A', seen);
    out.b_acquire_early = await new Flag(cb).acquire(1, 'B', seen);
    out.b_clear_early = await refusedOr(async () => (await cb.updateOne({ _id: 1 }, { $set: { locked: false } })).modifiedCount);
    earlyDone();
    await sleep(LEASE_MS + 500);
    out.b_clear_after_lease = (await cb.updateOne({ _id: 1 }, { $set: { locked: false } })).modifiedCount;
    out.b_acquire_after_clear = await new Flag(cb).acquire(1, 'B', seen);
    out.a_write_after_takeover = await refusedOr(() => new Flag(ca).write(1, 'A', 99));
    out.b_write = await new Flag(cb).write(1, 'B', 7);
  }
  out.final = (await cb.findOne({ _id: 1 })).n;
  console.log(JSON.stringify(out));
  await a.close();
  await b.close();
  await dc.close();
}

async function main() {
  const [scheme, mode, uri, direct, db, cname, k, m, rogue] = process.argv.slice(2);
  if (mode === 'work') await work(scheme, uri, direct, db, cname, Number(k), Number(m), rogue === '1');
  else await takeover(scheme, uri, direct, db, cname);
}

main().catch((e) => { console.error(e); process.exit(1); });
