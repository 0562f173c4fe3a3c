// Five common MongoDB locking libraries, each translated call for call into
// the Node.js driver: the same flows, arguments, output and sources as
// ../pymongo/libs.py (read its docstring and classes); libs_test.go judges.
//
// Usage: node libs.js <lib> <mode> <uri[,uri2]> <direct-uri> <db> <base> [K M rogue]
//
// The driver is the one installed for tests/compat (shared, read only).
'use strict';

const path = require('path');

const modules = path.join(__dirname, '..', '..', '..', 'compat', 'node', 'node_modules');
const { MongoClient, MongoServerError, UUID } = require(path.join(modules, 'mongodb'));

let BASE = 0;
let HOT = [1, 2, 3];
// The tests' lease, as in libs.py: from libs_test.go.
const LEASE_MS = Number(process.env.LOCKGATE_TEST_LEASE_MS);
if (!(LEASE_MS > 0)) throw new Error('LOCKGATE_TEST_LEASE_MS is not set (libs_test.go sets it)');

// A busy lock's pause before the next try, as libs.py's RETRY_S.
const RETRY_MS = 20;
// lockgate's policy.leaseMarginMS, as in libs.py.
const MARGIN_MS = Number(process.env.LOCKGATE_TEST_LEASE_MARGIN_MS);
if (!(MARGIN_MS >= 0)) throw new Error('LOCKGATE_TEST_LEASE_MARGIN_MS is not set (libs_test.go sets it)');

// What LockManyAsync's rollbacks met, as libs.py's new_rollback.
const newRollback = () => ({ writes: 0, refused: {}, failed: {}, expired: {} });
const mergeRollback = (into, r) => {
  into.writes += r.writes;
  for (const k of ['refused', 'failed', 'expired']) for (const [name, n] of Object.entries(r[k])) into[k][name] = (into[k][name] || 0) + n;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const errName = (e) => `${e instanceof MongoServerError ? 'OperationFailure' : e.constructor.name}/${e.code}`;
// BSON dates keep milliseconds, as Date does.
const utcnow = () => new Date();
const shape = (doc) => (doc === null || doc === undefined ? 'null' : `doc(${Object.keys(doc).sort().join(',')})`);

class LibError extends Error {
  constructor(name, message) { super(message); this.name = name; }
}

// mizrael/MongoLocks, MongoLocks/DummyRepository.cs (LockAsync, ReleaseLock).
class MongoLocks {
  static COLL = 'dummies';
  static FIELD = 'Value';

  constructor(db, lockMaxMS = LEASE_MS) { this.coll = db.collection(MongoLocks.COLL); this.max = lockMaxMS; }

  async lock(id, newEntity, seen) {
    const filter = { _id: id, $or: [{ LockId: null }, { LockTime: { $lt: new Date(Date.now() - this.max) } }] };
    const update = { $set: { LockId: new UUID(), LockTime: utcnow() } };
    if (newEntity) update.$setOnInsert = { _id: newEntity._id, Value: newEntity.Value };
    let doc;
    try {
      doc = await this.coll.findOneAndUpdate(filter, update, { upsert: true, returnDocument: 'after' });
    } catch (e) {
      // The original catches Code 11000 with CodeName "DuplicateKey" only.
      if (e instanceof MongoServerError && e.code === 11000 && e.codeName === 'DuplicateKey') {
        if (seen) seen.add(`lock:DuplicateKeyError/${e.code}`);
        throw new LibError('LockException', `item '${id}' is already locked`);
      }
      throw e;
    }
    if (seen) seen.add(`lock:${shape(doc)}`);
    return doc;
  }

  async release(item, seen) {
    const r = await this.coll.updateOne({ _id: item._id, LockId: item.LockId },
      { $set: { Value: item.Value, LockId: null, LockTime: null } }, { upsert: false });
    if (seen) seen.add(`release:matched=${r.matchedCount},modified=${r.modifiedCount}`);
    if (r.modifiedCount !== 1) throw new LibError('LockException', `unable to release lock on item '${item._id}'`);
  }

  async round(w, i, seen) {
    const id = HOT[(Math.floor(w / 2) + i) % HOT.length];
    let item;
    for (;;) {
      try { item = await this.lock(id, null, seen); break; } catch (e) {
        if (e.name !== 'LockException') throw e;
        await sleep(RETRY_MS);
      }
    }
    item.Value += 1;
    await this.release(item, seen);
  }

  static seedDoc(id) { return { _id: id, Value: 0, LockId: null, LockTime: null }; }
}

// drmirror/locks, lock.py (init, lock, unlock), one explicit session;
// polling where change streams are missing.
class DrMirror {
  static COLL = 'locks';
  static FIELD = 'n';

  constructor(db, session) { this.coll = db.collection(DrMirror.COLL); this.session = session; }

  async init(x) {
    // count() as the original (deprecated, still the count command).
    if ((await this.coll.count({ _id: x })) === 0) {
      try { await this.coll.insertOne({ _id: x, locked: false }); } catch (e) { /* inserted first by someone else */ }
    }
  }

  async tryLock(x, seen) {
    const r = await this.coll.updateOne({ _id: x, locked: false }, { $set: { locked: true } }, { session: this.session });
    if (seen) seen.add(`lock:matched=${r.matchedCount},modified=${r.modifiedCount}`);
    return r.modifiedCount === 1;
  }

  async lock(x, seen) {
    while (!(await this.tryLock(x, seen))) {
      const cursor = this.coll.watch(
        [{ $match: { 'documentKey._id': x, 'updateDescription.updatedFields.locked': false } }],
        { startAtOperationTime: this.session.operationTime, session: this.session });
      try {
        await cursor.next();
      } catch (e) {
        if (!(e instanceof MongoServerError)) throw e;
        if (seen) seen.add(`watch:${errName(e)}`);
        await sleep(RETRY_MS);
      } finally {
        await cursor.close();
      }
    }
  }

  async unlock(x, seen) {
    const r = await this.coll.updateOne({ _id: x }, { $set: { locked: false } }, { session: this.session });
    if (seen) seen.add(`unlock:matched=${r.matchedCount},modified=${r.modifiedCount}`);
    return r.modifiedCount;
  }

  async write(x, n) {
    return (await this.coll.updateOne({ _id: x }, { $set: { n } }, { session: this.session })).modifiedCount;
  }

  async round(w, i, seen) {
    const x = HOT[(Math.floor(w / 2) + i) % HOT.length];
    await this.lock(x, seen);
    const n = (await this.coll.findOne({ _id: x }, { session: this.session })).n;
    if ((await this.write(x, n + 1)) !== 1) seen.add('write:not_applied');
    await this.unlock(x, seen);
  }

  static seedDoc(id) { return { _id: id, locked: false, n: 0 }; }
}

// alistairjevans/mongodb-locks, LockProvider.cs and DistributedLock.cs.
class Alistair {
  static COLL = 'resources';
  static FIELD = 'n';
  static LOCKS = 'resourceLocks';

  constructor(db, expireMS = 60000) {
    this.coll = db.collection(Alistair.COLL);
    this.locks = db.collection(Alistair.LOCKS);
    this.expire = expireMS;
  }

  async setup() { await this.locks.createIndex({ ExpireAt: 1 }, { expireAfterSeconds: 0 }); }

  async attempt(resourceId, seen) {
    const lockId = `lock_${resourceId}`;
    let resp;
    try {
      resp = await this.locks.findOneAndUpdate(
        { _id: lockId },
        { $setOnInsert: { _id: lockId, ExpireAt: new Date(Date.now() + this.expire) } },
        { upsert: true, returnDocument: 'before' });
    } catch (e) {
      if (e instanceof MongoServerError && e.code === 11000) {
        if (seen) seen.add(`attempt:${errName(e)}`);
        return false;
      }
      throw e;
    }
    if (seen) seen.add(`attempt:${shape(resp)}`);
    return resp === null;
  }

  async acquire(resourceId, seen) {
    const start = Date.now();
    while (!(await this.attempt(resourceId, seen))) {
      await sleep(100);
      if (Date.now() - start > 10000) throw new LibError('ApplicationException', `Could not acquire lock for ${resourceId} within the timeout.`);
    }
  }

  async dispose(resourceId, seen) {
    const r = await this.locks.deleteOne({ _id: `lock_${resourceId}` });
    if (seen) seen.add(`dispose:deleted=${r.deletedCount}`);
    return r.deletedCount;
  }

  async write(resourceId, n) { return (await this.coll.updateOne({ _id: resourceId }, { $set: { n } })).modifiedCount; }

  async round(w, i, seen) {
    const r = `r${HOT[(Math.floor(w / 2) + i) % HOT.length]}`;
    await this.acquire(r, seen);
    const n = (await this.coll.findOne({ _id: r })).n;
    if ((await this.write(r, n + 1)) !== 1) seen.add('write:not_applied');
    await this.dispose(r, seen);
  }

  static seedDoc(id) { return { _id: `r${id}`, n: 0 }; }
}

// Tharga/MongoDB, Tharga.MongoDB/Lockable/LockableRepositoryCollectionBase.cs,
// EntityScope.cs, DocumentLease.cs, Disk/DiskRepositoryCollectionBase.cs.
class Tharga {
  static COLL = 'entities';
  static FIELD = 'Counter';

  constructor(db, timeoutMS = 30000, actor = 'worker') {
    this.coll = db.collection(Tharga.COLL);
    this.timeout = timeoutMS;
    this.actor = actor;
    this.rollback = newRollback();
  }

  async acquire(filter, failIfLocked, seen) {
    const now = utcnow();
    const lock = { LockKey: new UUID(), LockTime: now, ExpireTime: new Date(now.getTime() + this.timeout), Actor: this.actor };
    const unlocked = { ...filter, Lock: null };
    const expired = { ...filter, Lock: { $ne: null }, 'Lock.ExceptionInfo': null, 'Lock.ExpireTime': { $lt: now } };
    const before = await this.coll.findOneAndUpdate({ $or: [unlocked, expired] }, { $set: { Lock: lock } },
      { returnDocument: 'before', upsert: false });
    if (seen) seen.add(`acquire:${shape(before)}`);
    if (before === null) {
      if (!failIfLocked) return [null, null];
      const docs = await this.coll.find(filter).toArray();
      if (docs.length === 0) return [null, null];
      if (docs.length === 1) {
        if (!docs[0].Lock || docs[0].Lock.ExceptionInfo == null) throw new LibError('LockException', `Entity with id '${docs[0]._id}' is locked.`);
        throw new LibError('LockErrorException', `Entity with id '${docs[0]._id}' has an exception attached.`);
      }
      throw new LibError('UnknownException', `Matched with ${docs.length} documents but no unlocked`);
    }
    if (before.Lock && now <= before.Lock.ExpireTime) {
      throw new LibError('InvalidOperation', 'NotSupportedException: the entity that was picked had a lock that has not yet expired');
    }
    return [before, lock];
  }

  pick(id, seen) { return this.acquire({ _id: id }, true, seen); }

  pickFilter(filter, seen) { return this.acquire(filter, false, seen); }

  static expired(lock) { return Date.now() - lock.LockTime.getTime() > lock.ExpireTime.getTime() - lock.LockTime.getTime(); }

  async commit(entity, lock, seen) {
    if (Tharga.expired(lock)) throw new LibError('LockExpiredException', `Too late to release entity locked by ${lock.Actor}.`);
    const { Lock, ...replacement } = entity; // eslint-disable-line no-unused-vars
    const before = await this.coll.findOneAndReplace(
      { _id: entity._id, Lock: { $ne: null }, 'Lock.LockKey': lock.LockKey }, replacement);
    if (seen) seen.add(`commit:${shape(before)}`);
    if (before === null) throw new LibError('InvalidOperation', 'Cannot find entity before release.');
    if (!before.Lock) throw new LibError('InvalidOperation', 'No lock information for document before release.');
    return true;
  }

  async releaseWithoutCommit(entity, lockInfo, seen, step) {
    const item = await this.coll.find({ _id: entity._id }).limit(2).toArray();
    if (item.length > 1) throw new LibError('InvalidOperation', 'SingleOrDefault: more than one');
    if (item.length === 0) throw new LibError('InvalidOperation', 'Cannot find entity before release.');
    const before = await this.coll.findOneAndUpdate({ _id: item[0]._id }, { $set: { Lock: lockInfo } });
    if (seen) seen.add(`${step}:${shape(before)}`);
    if (before === null) throw new LibError('InvalidOperation', 'Cannot find entity before release.');
    if (!before.Lock) throw new LibError('InvalidOperation', 'No lock information for document before release.');
    const after = await this.coll.findOne({ _id: item[0]._id });
    return after !== null && (after.Lock === null || after.Lock === undefined);
  }

  abandon(entity, lock, seen) { return this.releaseWithoutCommit(entity, null, seen, 'abandon'); }

  setErrorState(entity, lock, message, seen) {
    if (Tharga.expired(lock)) throw new LibError('LockExpiredException', `Too late to release entity locked by ${lock.Actor}.`);
    return this.releaseWithoutCommit(entity, { ...lock, ExceptionInfo: { Type: 'Exception', Message: message, StackTrace: null } }, seen, 'error');
  }

  async releaseOneExceptionOnly(id, seen) {
    const before = await this.coll.findOneAndUpdate(
      { _id: id, Lock: { $ne: null }, 'Lock.ExceptionInfo': { $ne: null } }, { $set: { Lock: null } },
      { returnDocument: 'before', upsert: false });
    if (seen) seen.add(`releaseOne:${shape(before)}`);
    return before;
  }

  async lockMany(ids, seen) {
    const entries = [];
    try {
      for (const id of [...new Set(ids)].sort((a, b) => a - b)) {
        const [entity, lock] = await this.pick(id, seen);
        if (entity === null) throw new LibError('InvalidOperation', `No document with id '${id}' was found.`);
        entries.push([entity, lock]);
      }
      return entries;
    } catch (e) {
      // The library's best-effort rollback swallows its errors; the
      // harness counts them, as libs.py does.
      for (const [entity, lock] of entries) {
        this.rollback.writes++;
        try { await this.abandon(entity, lock, seen); } catch (e2) {
          let kind;
          let name;
          if (Date.now() + MARGIN_MS >= lock.ExpireTime.getTime()) [kind, name] = ['expired', e2.name];
          else if (e2 instanceof MongoServerError) [kind, name] = ['refused', e2.codeName || String(e2.code)];
          else [kind, name] = ['failed', e2.name];
          this.rollback[kind][name] = (this.rollback[kind][name] || 0) + 1;
        }
      }
      throw e;
    }
  }

  async waitPick(id, seen) {
    for (;;) {
      try { return await this.pick(id, seen); } catch (e) {
        if (e.name !== 'LockException') throw e;
        await sleep(RETRY_MS);
      }
    }
  }

  async round(w, i, seen) {
    if (i % 2 === 0) {
      const id = HOT[(Math.floor(w / 2) + i) % HOT.length];
      let [entity, lock] = await this.waitPick(id, seen);
      if (i % 4 === 0) {
        await this.abandon(entity, lock, seen);
        [entity, lock] = await this.waitPick(id, seen);
      }
      const n = (await this.coll.findOne({ _id: id })).Counter;
      await this.commit({ ...entity, Counter: n + 1 }, lock, seen);
      return;
    }
    const ids = [HOT[(Math.floor(w / 2) + i) % HOT.length], HOT[(Math.floor(w / 2) + i + 1) % HOT.length]];
    let entries;
    for (;;) {
      try { entries = await this.lockMany(ids, seen); break; } catch (e) {
        if (e.name !== 'LockException') throw e;
        seen.add('lockMany:LockException');
        await sleep(RETRY_MS);
      }
    }
    for (const [entity, lock] of entries) {
      const n = (await this.coll.findOne({ _id: entity._id })).Counter;
      await this.commit({ ...entity, Counter: n + 1 }, lock, seen);
    }
  }

  static seedDoc(id) { return { _id: id, Counter: 0 }; }
}

// codecentric, "Pessimistic Locking with MongoDB" (blog.codecentric.de,
// 2012/10/mongodb-pessimistic-locking).
class Codecentric {
  static COLL = 'workitem';
  static FIELD = 'n';

  constructor(db, aid = 'app') {
    this.coll = db.collection(Codecentric.COLL);
    this.locks = db.collection(`${Codecentric.COLL}.lock`);
    this.aid = aid;
  }

  async setup() {
    await this.locks.createIndex({ ts: 1 }, { expireAfterSeconds: Math.max(1, Math.floor(LEASE_MS / 1000)) });
    await this.locks.createIndex({ aid: 1 }, { unique: false });
  }

  async obtain(id, seen) {
    const doc = await this.coll.findOne({ _id: id });
    try {
      await this.locks.insertOne({ _id: doc._id, ts: utcnow(), aid: this.aid });
    } catch (e) {
      if (e instanceof MongoServerError && e.code === 11000) {
        if (seen) seen.add(`obtain:DuplicateKeyError/${e.code}`);
        return false;
      }
      throw e;
    }
    if (seen) seen.add('obtain:inserted');
    return true;
  }

  async release(id, seen) {
    const r = await this.locks.deleteOne({ _id: id });
    if (seen) seen.add(`release:deleted=${r.deletedCount}`);
    return r.deletedCount;
  }

  async releaseAll(seen) {
    const r = await this.locks.deleteMany({ aid: this.aid });
    if (seen) seen.add(`releaseAll:deleted=${r.deletedCount}`);
    return r.deletedCount;
  }

  async write(id, n) { return (await this.coll.updateOne({ _id: id }, { $set: { n } })).modifiedCount; }

  async round(w, i, seen) {
    const id = HOT[(Math.floor(w / 2) + i) % HOT.length];
    while (!(await this.obtain(id, seen))) await sleep(RETRY_MS);
    const n = (await this.coll.findOne({ _id: id })).n;
    if ((await this.write(id, n + 1)) !== 1) seen.add('write:not_applied');
    if (i % 2 === 0) await this.release(id, seen);
    else await this.releaseAll(seen);
  }

  static seedDoc(id) { return { _id: id, n: 0 }; }
}

const LIBS = { mongolocks: MongoLocks, drmirror: DrMirror, alistair: Alistair, tharga: Tharga, codecentric: Codecentric };

const client = (uri, app) => new MongoClient(uri, { appName: app, retryWrites: false });

async function seed(ddb, lib) {
  const cls = LIBS[lib];
  await ddb.collection(cls.COLL).deleteMany({});
  if (lib === 'alistair') await ddb.collection(Alistair.LOCKS).deleteMany({});
  if (lib === 'codecentric') await ddb.collection(`${Codecentric.COLL}.lock`).deleteMany({});
  for (const id of HOT) await ddb.collection(cls.COLL).insertOne(cls.seedDoc(id));
}

const refusedOr = async (f) => {
  try { return await f(); } catch (e) { if (e instanceof MongoServerError) return `refused/${e.code}`; throw e; }
};

async function setupCalls(lib, db) {
  const out = {};
  if (lib === 'alistair') out.createIndex = await refusedOr(async () => { await new Alistair(db).setup(); return 'ok'; });
  if (lib === 'codecentric') out.createIndex = await refusedOr(async () => { await new Codecentric(db).setup(); return 'ok'; });
  return out;
}

function make(lib, db, w, session) {
  if (lib === 'drmirror') return new DrMirror(db, session);
  // The other libraries' lease, not Tharga's default 30 s (libs.py).
  if (lib === 'tharga') return new Tharga(db, LEASE_MS, `w${w}`);
  if (lib === 'codecentric') return new Codecentric(db, `w${w}-${new UUID().toHexString()}`);
  return new LIBS[lib](db);
}

async function work(lib, uri, direct, dbname, k, m, rogue) {
  const uris = uri.split(',');
  const clients = uris.map((u) => client(u, 'lib-worker'));
  const dc = client(direct, 'lib-seed');
  await seed(dc.db(dbname), lib);
  const setup = await setupCalls(lib, clients[0].db(dbname));
  const cls = LIBS[lib];
  const seen = new Set();
  const errors = [];
  let stop = false;
  const rollback = newRollback();

  const worker = async (w) => {
    const c = clients[w % clients.length];
    const session = lib === 'drmirror' ? c.startSession() : undefined;
    const s = make(lib, c.db(dbname), w, session);
    try {
      if (lib === 'drmirror') for (const x of HOT) await s.init(x);
      for (let i = 0; i < m; i++) await s.round(w, i, seen);
    } catch (e) {
      seen.add(`worker_error:${e instanceof LibError ? e.name : errName(e)}`);
      errors.push(String(e));
    }
    if (session) await session.endSession();
    if (s instanceof Tharga) mergeRollback(rollback, s.rollback);
  };

  const landed = { update: 0, delete: 0 };
  const refused = new Set();
  const rogueLoop = async () => {
    const rc = client(uris[0], 'lib-rogue');
    const rdb = rc.db(dbname);
    const rcoll = rdb.collection(cls.COLL);
    let rlocks = null;
    if (lib === 'alistair') rlocks = rdb.collection(Alistair.LOCKS);
    if (lib === 'codecentric') rlocks = rdb.collection(`${Codecentric.COLL}.lock`);
    let i = 0;
    while (!stop) {
      const doc = cls.seedDoc(HOT[i % HOT.length]);
      const id = doc._id;
      const rid = lib === 'alistair' ? `lock_${id}` : id;
      i++;
      try {
        if (rlocks && i % 5 === 1) {
          if ((await rlocks.deleteOne({ _id: rid })).deletedCount) landed.delete++;
        } else if (rlocks && i % 5 === 2) {
          const f = lib === 'alistair' ? 'ExpireAt' : 'ts';
          if ((await rlocks.updateOne({ _id: rid }, { $set: { [f]: utcnow() } })).modifiedCount) landed.update++;
        } else if (i % 5 === 0) {
          const r = await rcoll.deleteOne({ _id: id });
          if (r.deletedCount) {
            landed.delete++;
            await rcoll.insertOne(doc);
          }
        } else {
          const r = await rcoll.updateOne({ _id: id }, { $inc: { [cls.FIELD]: 1000 } });
          if (r.modifiedCount) landed.update++;
        }
      } catch (e) {
        if (e instanceof MongoServerError) refused.add(`${e.code}/${e.codeName}`);
        else throw e;
      }
      // Paced as libs.py's rogue is.
      await sleep(10);
    }
    await rc.close();
  };

  const rp = rogue ? rogueLoop() : Promise.resolve();
  await Promise.all(Array.from({ length: k }, (_, w) => worker(w)));
  stop = true;
  await rp;
  const counters = {};
  for (const d of await dc.db(dbname).collection(cls.COLL).find({}, { sort: { _id: 1 } }).toArray()) counters[String(d._id)] = d[cls.FIELD];
  console.log(JSON.stringify({
    counters, rogueLanded: landed, rogueRefused: [...refused].sort(), outcomes: [...seen].sort(), setup, errors: errors.slice(0, 5), rollback,
  }));
  for (const c of clients) await c.close();
  await dc.close();
}

// A step's result as the library reports it: its value, the name of the
// library exception it threw, or "refused/<code>".
async function outcomeOf(f) {
  try { return await f(); } catch (e) {
    if (e instanceof MongoServerError) return `refused/${e.code}`;
    if (e instanceof LibError) return e.name;
    return e.constructor.name;
  }
}

async function takeover(lib, uri, direct, dbname) {
  const out = {};
  const I = (n) => BASE + n;
  const R = `r${I(1)}`;
  const a = client(uri, 'lib-crashed');
  const b = client(uri, 'lib-successor');
  const dc = client(direct, 'lib-seed');
  await seed(dc.db(dbname), lib);
  const da = a.db(dbname);
  const db = b.db(dbname);
  const held = {};
  if (lib === 'mongolocks') {
    const la = new MongoLocks(da);
    const lb = new MongoLocks(db);
    const lock = async (l, who, id, ne) => {
      const doc = await l.lock(id, ne);
      held[who] = doc;
      return doc && doc.LockId ? 'locked' : shape(doc);
    };
    const release = async (l, who, value) => { await l.release({ ...held[who], Value: value }); return 'released'; };
    out.a_lock = await outcomeOf(() => lock(la, 'a', I(1)));
    out.b_lock_early = await outcomeOf(() => lock(lb, 'b', I(1)));
    await sleep(LEASE_MS + 600);
    out.b_lock_after_lease = await outcomeOf(() => lock(lb, 'b', I(1)));
    out.a_release_after_takeover = await outcomeOf(() => release(la, 'a', 99));
    out.b_release = await outcomeOf(() => release(lb, 'b', 7));
    out.c_lock_new = await outcomeOf(() => lock(la, 'c', I(42), { _id: I(42), Value: 5 }));
    out.c_release_new = await outcomeOf(() => release(la, 'c', 6));
    out.new_value = (await dc.db(dbname).collection(MongoLocks.COLL).findOne({ _id: I(42) })).Value;
    out.final = (await dc.db(dbname).collection(MongoLocks.COLL).findOne({ _id: I(1) })).Value;
  } else if (lib === 'drmirror') {
    const sa = a.startSession();
    const sb = b.startSession();
    const la = new DrMirror(da, sa);
    const lb = new DrMirror(db, sb);
    await la.init(I(1));
    await lb.init(I(1));
    out.a_lock = await outcomeOf(() => la.tryLock(I(1)));
    out.b_lock_early = await outcomeOf(() => lb.tryLock(I(1)));
    out.b_unlock_early = await outcomeOf(() => lb.unlock(I(1)));
    await sleep(LEASE_MS + 500);
    out.b_unlock_after_lease = await outcomeOf(() => lb.unlock(I(1)));
    out.b_lock = await outcomeOf(() => lb.tryLock(I(1)));
    out.a_write_after_takeover = await outcomeOf(() => la.write(I(1), 99));
    out.a_unlock_after_takeover = await outcomeOf(() => la.unlock(I(1)));
    out.b_write = await outcomeOf(() => lb.write(I(1), 7));
    out.b_unlock = await outcomeOf(() => lb.unlock(I(1)));
    out.final = (await dc.db(dbname).collection(DrMirror.COLL).findOne({ _id: I(1) })).n;
    await sa.endSession();
    await sb.endSession();
  } else if (lib === 'alistair') {
    const la = new Alistair(da, LEASE_MS);
    const lb = new Alistair(db, LEASE_MS);
    out.a_acquire = await outcomeOf(() => la.attempt(R));
    out.b_acquire_early = await outcomeOf(() => lb.attempt(R));
    await sleep(LEASE_MS + 600);
    out.b_acquire_after_expiry = await outcomeOf(() => lb.attempt(R));
    out.a_write_after_takeover = await outcomeOf(() => la.write(R, 99));
    out.a_dispose_after_takeover = await outcomeOf(() => la.dispose(R));
    out.b_write = await outcomeOf(() => lb.write(R, 7));
    out.b_dispose = await outcomeOf(() => lb.dispose(R));
    out.a_acquire_after_release = await outcomeOf(() => la.attempt(R));
    out.final = (await dc.db(dbname).collection(Alistair.COLL).findOne({ _id: R })).n;
  } else if (lib === 'tharga') {
    const ta = new Tharga(da, LEASE_MS, 'A');
    const tb = new Tharga(db, LEASE_MS, 'B');
    const ddb = dc.db(dbname).collection(Tharga.COLL);
    await ddb.insertMany([{ _id: I(4), Counter: 0, Group: 'g' }, { _id: I(5), Counter: 0, Group: 'g' },
      { _id: I(6), Counter: 0 }, { _id: I(7), Counter: 0 }]);
    const pick = async (t, who, id) => {
      const [e, l] = await t.pick(id);
      held[who] = [e, l];
      return e ? 'picked' : 'null';
    };
    out.a_pick = await outcomeOf(() => pick(ta, 'a', I(1)));
    out.b_pick_early = await outcomeOf(() => pick(tb, 'b', I(1)));
    await sleep(LEASE_MS + 600);
    out.b_pick_after_expiry = await outcomeOf(() => pick(tb, 'b', I(1)));
    out.a_commit_after_takeover = await outcomeOf(() => ta.commit({ ...held.a[0], Counter: 99 }, held.a[1]));
    out.a_abandon_after_takeover = await outcomeOf(() => ta.abandon(...held.a));
    out.b_commit = await outcomeOf(() => tb.commit({ ...held.b[0], Counter: 7 }, held.b[1]));
    out.final = (await ddb.findOne({ _id: I(1) })).Counter;
    out.a_pick_2 = await outcomeOf(() => pick(ta, 'a2', I(2)));
    out.a_error_state = await outcomeOf(() => ta.setErrorState(...held.a2, 'failed halfway'));
    out.b_pick_error = await outcomeOf(() => pick(tb, 'b2', I(2)));
    await sleep(LEASE_MS + 600);
    out.b_pick_error_after_expiry = await outcomeOf(() => pick(tb, 'b2', I(2)));
    out.b_release_exception = await outcomeOf(async () => shape(await tb.releaseOneExceptionOnly(I(2))));
    out.b_pick_after_release = await outcomeOf(() => pick(tb, 'b2', I(2)));
    out.b_commit_2 = await outcomeOf(() => tb.commit({ ...held.b2[0], Counter: 3 }, held.b2[1]));
    out.a_pick_4 = await outcomeOf(() => pick(ta, 'a4', I(4)));
    const pickGroup = async () => {
      const [e, l] = await tb.pickFilter({ Group: 'g' });
      held.bg = [e, l];
      return e ? `picked:${e._id - BASE}` : 'null';
    };
    out.b_pick_group = await outcomeOf(pickGroup);
    out.b_commit_group = await outcomeOf(() => tb.commit({ ...held.bg[0], Counter: 1 }, held.bg[1]));
    out.a_commit_4 = await outcomeOf(() => ta.commit({ ...held.a4[0], Counter: 1 }, held.a4[1]));
    out.a_pick_7 = await outcomeOf(() => pick(ta, 'a7', I(7)));
    out.b_lock_many_busy = await outcomeOf(async () => (await tb.lockMany([I(7), I(6)])).length);
    out.lock_6_after_rollback = !(await ddb.findOne({ _id: I(6) })).Lock;
    out.a_commit_7 = await outcomeOf(() => ta.commit({ ...held.a7[0], Counter: 1 }, held.a7[1]));
    out.b_lock_many = await outcomeOf(async () => {
      const entries = await tb.lockMany([I(7), I(6)]);
      for (const [e, l] of entries) await tb.commit({ ...e, Counter: e.Counter + 10 }, l);
      return entries.length;
    });
    out.final_4_5_6_7 = [];
    for (const n of [4, 5, 6, 7]) out.final_4_5_6_7.push((await ddb.findOne({ _id: I(n) })).Counter);
  } else if (lib === 'codecentric') {
    const la = new Codecentric(da, 'A');
    const lb = new Codecentric(db, 'B');
    out.a_obtain = await outcomeOf(() => la.obtain(I(1)));
    out.b_obtain_early = await outcomeOf(() => lb.obtain(I(1)));
    out.b_release_early = await outcomeOf(() => lb.release(I(1)));
    await sleep(LEASE_MS + 600);
    out.b_obtain_after_ttl = await outcomeOf(() => lb.obtain(I(1)));
    out.a_write_after_takeover = await outcomeOf(() => la.write(I(1), 99));
    out.b_write = await outcomeOf(() => lb.write(I(1), 7));
    out.a_release_all_after_takeover = await outcomeOf(() => la.releaseAll());
    out.b_release_all = await outcomeOf(() => lb.releaseAll());
    out.a_obtain_after_release = await outcomeOf(() => la.obtain(I(1)));
    out.final = (await dc.db(dbname).collection(Codecentric.COLL).findOne({ _id: I(1) })).n;
  }
  console.log(JSON.stringify(out));
  await a.close();
  await b.close();
  await dc.close();
}

async function main() {
  const [lib, mode, uri, direct, dbname, base, k, m, rogue] = process.argv.slice(2);
  BASE = Number(base);
  HOT = [BASE + 1, BASE + 2, BASE + 3];
  if (mode === 'work') await work(lib, uri, direct, dbname, Number(k), Number(m), rogue === '1');
  else if (mode === 'setup') {
    const c = client(uri, 'lib-setup');
    console.log(JSON.stringify(await setupCalls(lib, c.db(dbname))));
    await c.close();
  } else await takeover(lib, uri, direct, dbname);
}

main().catch((e) => { console.error(e); process.exit(1); });
