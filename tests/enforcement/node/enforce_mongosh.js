// lockgate enforcement checks for mongosh.
//
// Usage: ENF_PROXY=<proxy-uri> ENF_DIRECT=<direct-uri> ENF_DB=<database> \
//   mongosh --nodb --quiet --norc --file enforce_mongosh.js
//
// The same checks, with the same operations and arguments, as enforce.js
// (the Node.js driver) and ../pymongo/enforce.py, written with the shell's
// own API (collection helpers, Session.getDatabase, runCommand). One JSON
// line per check: {"case", "error", "result", "before", "after"}; before
// and after are the whole collection read directly, canonical extended
// JSON. The Go test (tests/enforcement/enforce_test.go) judges them.

const PROXY = process.env.ENF_PROXY;
const DIRECT = process.env.ENF_DIRECT;
const DB = process.env.ENF_DB;
const HOLDER_APP = 'enf-mongosh-holder';
const CALLER_APP = 'enf-mongosh-caller';
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
      n64: NumberLong(String(i * 2 ** 40)),
      price: i + 0.5,
      when: new Date(Date.UTC(2020, 0, i, 3, 4, 5, 6)),
      tags: ['t' + i, i],
      nested: { k: i, b: BinData(0, Buffer.from([i]).toString('base64')) },
    });
  }
  return docs;
}

function snapshot(coll) {
  return ejson({ docs: coll.find({}).sort({ _id: 1 }).toArray() });
}

function errorDoc(e) {
  const reply = e.errorResponse || (e.cause && e.cause.errorResponse) || null;
  const lg = e.lockgate || (reply && reply.lockgate) || (e.cause && e.cause.lockgate) || null;
  return {
    type: e.name,
    code: e.code === undefined ? null : e.code,
    codeName: e.codeName === undefined ? (reply && reply.codeName) || null : e.codeName,
    errmsg: e.errmsg || (reply && reply.errmsg) || e.message,
    detail: lg ? ejson(lg) : null,
    raw: reply ? ejson(reply) : null,
  };
}

// mongosh's result classes: UpdateResult names the upserted _id insertedId.
function writeResult(r) {
  const out = {};
  const keys = [
    ['matchedCount', 'matched'], ['modifiedCount', 'modified'], ['deletedCount', 'deleted'],
    ['insertedCount', 'inserted'], ['upsertedCount', 'upserted'],
  ];
  for (const [attr, key] of keys) if (r[attr] !== undefined) out[key] = r[attr];
  if (r.upsertedCount === 1 && r.insertedId !== undefined && r.insertedId !== null) out.upsertedId = r.insertedId;
  return out;
}

function check(name, direct, fn) {
  const before = snapshot(direct);
  let error = null;
  let result = null;
  try {
    result = ejson(fn());
  } catch (e) {
    if (e.code === undefined && !e.errorResponse) throw e;
    error = errorDoc(e);
  }
  const after = snapshot(direct);
  print(JSON.stringify({ case: name, error, result, before, after }));
}

// Every write API, in the order enforce_test.go expects (writeAPIs).
function writeAPIs(c) {
  return [
    ['updateOne', () => writeResult(c.updateOne({ _id: 1 }, { $set: { qty: 11 } }))],
    ['updateMany_pinned', () => writeResult(c.updateMany({ _id: { $in: [1, 2] } }, { $set: { flag: 'm' } }))],
    ['updateMany_unpinned', () => writeResult(c.updateMany({ status: 'open' }, { $set: { seen: true } }))],
    ['replaceOne', () => writeResult(c.replaceOne({ _id: 2 }, { status: 'open', qty: 22, sku: 'b2' }))],
    ['findOneAndUpdate', () => ({ doc: c.findOneAndUpdate({ _id: 4 }, { $set: { qty: 44 } }, { returnNewDocument: true }) })],
    ['findOneAndReplace_unpinned', () => ({ doc: c.findOneAndReplace({ sku: 'e' }, { status: 'closed', qty: 55, sku: 'e2' }) })],
    ['findOneAndDelete', () => ({ doc: c.findOneAndDelete({ _id: 6 }) })],
    ['deleteOne', () => writeResult(c.deleteOne({ _id: 3 }))],
    // One command per run of one kind (update, delete, insert); ordered,
    // the first refused command stops the bulk write before the insert.
    ['bulkWrite_ordered', () => writeResult(c.bulkWrite([
      { updateOne: { filter: { _id: 1 }, update: { $set: { bulk: 'u' } } } },
      { replaceOne: { filter: { _id: 2 }, replacement: { status: 'open', qty: 222, sku: 'b3' } } },
      { deleteOne: { filter: { _id: 4 } } },
      { insertOne: { document: { _id: 100, status: 'new' } } },
    ], { ordered: true }))],
    // Unordered: every command is sent; no insert, so nothing may change.
    ['bulkWrite_unordered', () => writeResult(c.bulkWrite([
      { updateOne: { filter: { _id: 5 }, update: { $set: { bulk: 'v' } } } },
      { deleteOne: { filter: { _id: 100 } } },
    ], { ordered: false }))],
    ['upsert_pinned', () => writeResult(c.updateOne({ _id: 200 }, { $set: { status: 'new', qty: 200 } }, { upsert: true }))],
    ['upsert_unpinned_match', () => writeResult(c.updateOne({ sku: 'a' }, { $set: { via: 'upsert' } }, { upsert: true }))],
    ['upsert_unpinned_setOnInsert_id', () => writeResult(c.updateOne(
      { sku: 'zz' }, { $set: { status: 'new' }, $setOnInsert: { _id: 201 } }, { upsert: true }))],
    ['updateMany_mixed_numeric_ids', () => writeResult(c.updateMany(
      { _id: { $in: [NumberLong('1'), Double(2)] } }, { $set: { num: 'x' } }))],
    ['replaceOne_upsert_unpinned', () => writeResult(c.replaceOne(
      { sku: 'q' }, { _id: 202, sku: 'q', status: 'new' }, { upsert: true }))],
    ['findOneAndUpdate_upsert_pinned', () => ({
      doc: c.findOneAndUpdate({ _id: 203 }, { $set: { status: 'new' } }, { upsert: true, returnNewDocument: true }),
    })],
    ['deleteMany_unpinned', () => writeResult(c.deleteMany({ status: 'closed' }))],
  ];
}

function seed(ddb, name) {
  ddb.getCollection(name).drop();
  ddb.getCollection(name).insertMany(seedDocs());
  return ddb.getCollection(name);
}

const lock = (sdb, coll, ids) => sdb.runCommand({ acquireLock: coll, ids, leaseMS: 60000 });

const direct = Mongo(DIRECT);
const caller = Mongo(PROXY + '?appName=' + CALLER_APP);
const holder = Mongo(PROXY + '?appName=' + HOLDER_APP);
const ddb = direct.getDB(DB);
const cdb = caller.getDB(DB);

// (1) No lock at all, the shell's implicit session: every write refused.
let dc = seed(ddb, 'nolock');
for (const [name, fn] of writeAPIs(cdb.getCollection('nolock'))) check('nolock/' + name, dc, fn);
// An unacknowledged write: no lsid, refused, connection closed by the
// proxy; nothing written, and the shell goes on working.
check('nolock/unacknowledged_update_one', dc, () => {
  const r = cdb.getCollection('nolock').updateOne({ _id: 1 }, { $set: { qty: 999 } }, { writeConcern: { w: 0 } });
  sleep(500);
  let ping = 'ok';
  try {
    cdb.runCommand({ ping: 1 });
  } catch (e) {
    cdb.runCommand({ ping: 1 });
    ping = 'ok_after_retry';
  }
  return { acknowledged: r.acknowledged, ping };
});

// (2) Locked by another session of another application.
dc = seed(ddb, 'other');
const hs = holder.startSession();
check('other/holder_acquireLock', dc, () => lock(hs.getDatabase(DB), 'other', LOCK_IDS));
let s = caller.startSession();
for (const [name, fn] of writeAPIs(s.getDatabase(DB).getCollection('other'))) check('other/' + name, dc, fn);
s.endSession();
check('other/holder_releaseLock', dc, () => hs.getDatabase(DB).runCommand({ releaseLock: 'other' }));
hs.endSession();

// (3) Locked by the caller's own session, writes in that session.
dc = seed(ddb, 'own');
s = caller.startSession();
const sdb = s.getDatabase(DB);
check('own/acquireLock', dc, () => lock(sdb, 'own', LOCK_IDS));
check('own/renewLock', dc, () => sdb.runCommand({ renewLock: 'own', ids: LOCK_IDS, leaseMS: 60000 }));
check('own/lockStatus', dc, () => sdb.runCommand({ lockStatus: 'own', ids: LOCK_IDS }));
for (const [name, fn] of writeAPIs(sdb.getCollection('own'))) check('own/' + name, dc, fn);
check('own/releaseLock', dc, () => sdb.runCommand({ releaseLock: 'own' }));
s.endSession();

// Pinning, visibly: 1..3 locked, doc 4 inserted directly and unlocked.
dc = seed(ddb, 'pin');
dc.deleteMany({ _id: { $gte: 4 } });
dc.insertOne({ _id: 4, status: 'open', qty: 40 });
s = caller.startSession();
const pdb = s.getDatabase(DB);
check('pin/acquireLock', dc, () => lock(pdb, 'pin', [1, 2, 3]));
const upd = () => writeResult(pdb.getCollection('pin').updateMany({ status: 'open' }, { $set: { status: 'done' } }));
check('pin/unlocked_match_refused', dc, upd);
dc.deleteOne({ _id: 4 });
check('pin/locked_matches_applied', dc, upd);
check('pin/releaseLock', dc, () => pdb.runCommand({ releaseLock: 'pin' }));
s.endSession();

// Reference: the unpinned upsert sent DIRECTLY to the server, so the test
// can show what the document it inserts must look like.
dc = seed(ddb, 'reference');
check('direct/upsert_unpinned_setOnInsert_id', dc, () => writeResult(dc.updateOne(
  { sku: 'zz' }, { $set: { status: 'new' }, $setOnInsert: { _id: 201 } }, { upsert: true })));

caller.close();
holder.close();
direct.close();
