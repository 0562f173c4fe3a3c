// lockgate enforcement checks for the Node.js driver.
//
// Usage: node enforce.js <proxy-uri> <direct-uri> <database>
//
// Every collection of <database> is enforced by the proxy. The script seeds
// each collection through the DIRECT connection, runs every write API
// through the PROXY, and prints one JSON line per check:
//
//   {"case": "...", "error": null | {...}, "result": null | "<ejson>",
//    "before": "<ejson>", "after": "<ejson>"}
//
// before/after are the whole collection read directly (sorted by _id), as
// canonical extended JSON: {"docs": [...]}. The script judges nothing; the
// Go test (tests/enforcement/enforce_test.go) holds the expectations. The
// operations and their arguments must stay identical to pymongo/enforce.py.
//
// The driver is the one installed for tests/compat (shared, read only).
'use strict';

const path = require('path');

const modules = path.join(__dirname, '..', '..', 'compat', 'node', 'node_modules');
const { MongoClient, MongoError, Long, Double, Binary, BSON } = require(path.join(modules, 'mongodb'));
const { EJSON } = BSON;

const HOLDER_APP = 'enf-node-holder';
const CALLER_APP = 'enf-node-caller';
const LOCK_IDS = [1, 2, 3, 4, 5, 6, 100, 200, 201, 202, 203];

const ejson = (v) => EJSON.stringify(v, { relaxed: false });

function seedDocs() {
  const docs = [];
  for (let i = 1; i <= 6; i++) {
    docs.push({
      _id: i,
      status: i <= 3 ? 'open' : 'closed',
      qty: 10 * i,
      sku: 'abcdef'[i - 1],
      n64: Long.fromNumber(i * 2 ** 40),
      price: i + 0.5,
      when: new Date(Date.UTC(2020, 0, i, 3, 4, 5, 6)),
      tags: ['t' + i, i],
      nested: { k: i, b: new Binary(Buffer.from([i])) },
    });
  }
  return docs;
}

async function snapshot(coll) {
  return ejson({ docs: await coll.find({}).sort({ _id: 1 }).toArray() });
}

function errorDoc(e) {
  const doc = {
    type: e.constructor.name,
    code: e.code ?? null,
    codeName: e.codeName ?? null,
    errmsg: e.errmsg ?? e.message,
    detail: null,
    raw: null,
  };
  // MongoServerError copies the reply's fields onto itself; a bulk write
  // error keeps the server error as its cause or in errorResponse.
  const reply = e.errorResponse ?? e.cause?.errorResponse ?? null;
  if (reply) doc.raw = ejson(reply);
  const lg = e.lockgate ?? reply?.lockgate ?? e.cause?.lockgate;
  if (lg !== undefined && lg !== null) doc.detail = ejson(lg);
  if (doc.codeName === null && e.cause?.codeName) doc.codeName = e.cause.codeName;
  return doc;
}

function writeResult(r) {
  const out = {};
  const keys = [
    ['matchedCount', 'matched'], ['modifiedCount', 'modified'], ['deletedCount', 'deleted'],
    ['insertedCount', 'inserted'], ['upsertedCount', 'upserted'],
  ];
  for (const [attr, key] of keys) if (r[attr] !== undefined) out[key] = r[attr];
  if (r.upsertedId !== undefined && r.upsertedId !== null) out.upsertedId = r.upsertedId;
  return out;
}

async function check(name, direct, fn) {
  const before = await snapshot(direct);
  let error = null;
  let result = null;
  try {
    result = ejson(await fn());
  } catch (e) {
    if (!(e instanceof MongoError)) throw e;
    error = errorDoc(e);
  }
  const after = await snapshot(direct);
  process.stdout.write(JSON.stringify({ case: name, error, result, before, after }) + '\n');
}

// Every write API, in the order enforce_test.go expects (writeAPIs). In the
// "own" situation they run one after another on one collection, so each
// one's expected effect depends on the ones before it. s is undefined for
// the implicit session.
function writeAPIs(c, s) {
  const o = (extra) => ({ ...extra, session: s });
  return [
    ['updateOne', async () => writeResult(await c.updateOne({ _id: 1 }, { $set: { qty: 11 } }, o()))],
    ['updateMany_pinned', async () => writeResult(await c.updateMany({ _id: { $in: [1, 2] } }, { $set: { flag: 'm' } }, o()))],
    ['updateMany_unpinned', async () => writeResult(await c.updateMany({ status: 'open' }, { $set: { seen: true } }, o()))],
    ['replaceOne', async () => writeResult(await c.replaceOne({ _id: 2 }, { status: 'open', qty: 22, sku: 'b2' }, o()))],
    ['findOneAndUpdate', async () => ({
      doc: await c.findOneAndUpdate({ _id: 4 }, { $set: { qty: 44 } }, o({ returnDocument: 'after' })),
    })],
    ['findOneAndReplace_unpinned', async () => ({
      doc: await c.findOneAndReplace({ sku: 'e' }, { status: 'closed', qty: 55, sku: 'e2' }, o()),
    })],
    ['findOneAndDelete', async () => ({ doc: await c.findOneAndDelete({ _id: 6 }, o()) })],
    ['deleteOne', async () => writeResult(await c.deleteOne({ _id: 3 }, o()))],
    // Drivers send a bulk write as one command per run of operations of
    // one kind: here update (updateOne + replaceOne), delete, insert.
    // Ordered, the first refused command stops the bulk write, so the
    // insert at the end (which the policy would allow) is never sent and
    // "nothing changed" is the right expectation without a lock.
    ['bulkWrite_ordered', async () => writeResult(await c.bulkWrite([
      { updateOne: { filter: { _id: 1 }, update: { $set: { bulk: 'u' } } } },
      { replaceOne: { filter: { _id: 2 }, replacement: { status: 'open', qty: 222, sku: 'b3' } } },
      { deleteOne: { filter: { _id: 4 } } },
      { insertOne: { document: { _id: 100, status: 'new' } } },
    ], o({ ordered: true })))],
    // Unordered, every command is sent even after a refusal; there is no
    // insert in it, so again nothing may change without the locks.
    ['bulkWrite_unordered', async () => writeResult(await c.bulkWrite([
      { updateOne: { filter: { _id: 5 }, update: { $set: { bulk: 'v' } } } },
      { deleteOne: { filter: { _id: 100 } } },
    ], o({ ordered: false })))],
    ['upsert_pinned', async () => writeResult(await c.updateOne(
      { _id: 200 }, { $set: { status: 'new', qty: 200 } }, o({ upsert: true })))],
    ['upsert_unpinned_match', async () => writeResult(await c.updateOne(
      { sku: 'a' }, { $set: { via: 'upsert' } }, o({ upsert: true })))],
    ['upsert_unpinned_setOnInsert_id', async () => writeResult(await c.updateOne(
      { sku: 'zz' }, { $set: { status: 'new' }, $setOnInsert: { _id: 201 } }, o({ upsert: true })))],
    // The same _id in other numeric types is the same lock.
    ['updateMany_mixed_numeric_ids', async () => writeResult(await c.updateMany(
      { _id: { $in: [Long.fromNumber(1), new Double(2)] } }, { $set: { num: 'x' } }, o()))],
    ['replaceOne_upsert_unpinned', async () => writeResult(await c.replaceOne(
      { sku: 'q' }, { _id: 202, sku: 'q', status: 'new' }, o({ upsert: true })))],
    ['findOneAndUpdate_upsert_pinned', async () => ({
      doc: await c.findOneAndUpdate({ _id: 203 }, { $set: { status: 'new' } }, o({ upsert: true, returnDocument: 'after' })),
    })],
    ['deleteMany_unpinned', async () => writeResult(await c.deleteMany({ status: 'closed' }, o()))],
  ];
}

async function unacknowledged(db, coll) {
  const r = await db.collection(coll).updateOne({ _id: 1 }, { $set: { qty: 999 } }, { writeConcern: { w: 0 } });
  // Long enough for the write to land if it had been forwarded.
  await new Promise((resolve) => setTimeout(resolve, 500));
  let ping = 'ok';
  try {
    await db.command({ ping: 1 });
  } catch (e) {
    await db.command({ ping: 1 });
    ping = 'ok_after_retry';
  }
  return { acknowledged: r.acknowledged, ping };
}

async function seed(ddb, name) {
  await ddb.collection(name).drop().catch(() => {});
  await ddb.collection(name).insertMany(seedDocs());
  return ddb.collection(name);
}

const lock = (db, s, coll, ids) => db.command({ acquireLock: coll, ids, leaseMS: 60000 }, { session: s });

async function main() {
  const [proxyURI, directURI, dbName] = process.argv.slice(2);
  const opts = { serverSelectionTimeoutMS: 20000 };
  const direct = await MongoClient.connect(directURI, opts);
  const caller = await MongoClient.connect(proxyURI, { ...opts, appName: CALLER_APP });
  const holder = await MongoClient.connect(proxyURI, { ...opts, appName: HOLDER_APP });
  try {
    const ddb = direct.db(dbName);
    const cdb = caller.db(dbName);
    const hdb = holder.db(dbName);

    // (1) No lock at all, no explicit session (the driver's implicit
    // session still sends an lsid): every write is refused.
    let dc = await seed(ddb, 'nolock');
    for (const [name, fn] of writeAPIs(cdb.collection('nolock'), undefined)) await check('nolock/' + name, dc, fn);
    // An unacknowledged (w:0) write: the driver sends it with moreToCome
    // and no lsid (sessions are not used for unacknowledged writes), so it
    // cannot hold locks and is refused; with no reply to carry the error,
    // the proxy closes the connection. Nothing may be written, and the
    // client must go on working (a ping, retried once after the closed
    // connection).
    await check('nolock/unacknowledged_update_one', dc, () => unacknowledged(cdb, 'nolock'));

    // (2) Locked by another session, of another application: the caller's
    // explicit session is refused and told who holds the lock.
    dc = await seed(ddb, 'other');
    const hs = holder.startSession();
    await check('other/holder_acquireLock', dc, () => lock(hdb, hs, 'other', LOCK_IDS));
    let s = caller.startSession();
    for (const [name, fn] of writeAPIs(cdb.collection('other'), s)) await check('other/' + name, dc, fn);
    await s.endSession();
    await check('other/holder_releaseLock', dc, () => hdb.command({ releaseLock: 'other' }, { session: hs }));
    await hs.endSession();

    // (3) Locked by the caller's own explicit session, writes passed that
    // session: applied.
    dc = await seed(ddb, 'own');
    s = caller.startSession();
    await check('own/acquireLock', dc, () => lock(cdb, s, 'own', LOCK_IDS));
    await check('own/renewLock', dc, () => cdb.command({ renewLock: 'own', ids: LOCK_IDS, leaseMS: 60000 }, { session: s }));
    await check('own/lockStatus', dc, () => cdb.command({ lockStatus: 'own', ids: LOCK_IDS }, { session: s }));
    for (const [name, fn] of writeAPIs(cdb.collection('own'), s)) await check('own/' + name, dc, fn);
    await check('own/releaseLock', dc, () => cdb.command({ releaseLock: 'own' }, { session: s }));
    await s.endSession();

    // Pinning, visibly: ids 1..3 ("open") are locked; doc 4, "open" too, is
    // inserted directly (not through the proxy) and not locked, so
    // updateMany({status: "open"}) must be refused whole; once doc 4 is
    // gone (deleted directly) it applies to exactly 1..3.
    dc = await seed(ddb, 'pin');
    await dc.deleteMany({ _id: { $gte: 4 } });
    await dc.insertOne({ _id: 4, status: 'open', qty: 40 });
    s = caller.startSession();
    await check('pin/acquireLock', dc, () => lock(cdb, s, 'pin', [1, 2, 3]));
    const upd = async () => writeResult(await cdb.collection('pin').updateMany(
      { status: 'open' }, { $set: { status: 'done' } }, { session: s }));
    await check('pin/unlocked_match_refused', dc, upd);
    await dc.deleteOne({ _id: 4 });
    await check('pin/locked_matches_applied', dc, upd);
    await check('pin/releaseLock', dc, () => cdb.command({ releaseLock: 'pin' }, { session: s }));
    await s.endSession();

    // Reference: the unpinned upsert sent DIRECTLY to the server, so the
    // test can show what the document it inserts must look like.
    dc = await seed(ddb, 'reference');
    await check('direct/upsert_unpinned_setOnInsert_id', dc, async () => writeResult(await dc.updateOne(
      { sku: 'zz' }, { $set: { status: 'new' }, $setOnInsert: { _id: 201 } }, { upsert: true })));
  } finally {
    await Promise.all([caller.close(), holder.close(), direct.close()]);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
