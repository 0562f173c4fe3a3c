// lockgate compatibility script for the Node.js driver.
//
// Usage: node compat.js <mongodb-uri> <database>
//
// Runs a fixed sequence of operations against <database> (dropped first) and
// prints one JSON document: {"client": ..., "steps": [...]}; each step is
// {"name", "result"} or {"name", "error"}. tests/compat_test.go runs it
// directly against the upstream and through the proxy and requires identical
// output after the normalisation documented there. Nothing is normalised here;
// canon() keeps BSON type information.
'use strict';

const { MongoClient, ObjectId, Long, Binary, Double, MongoError } = require('mongodb');
const pkg = require('mongodb/package.json');

function canon(v) {
  if (v === null || v === undefined) return null;
  if (Array.isArray(v)) return v.map(canon);
  switch (typeof v) {
    case 'string':
    case 'boolean':
      return v;
    case 'number':
      return Number.isInteger(v) ? { $number: String(v) } : { $numberDouble: String(v) };
    case 'bigint':
      return { $numberLong: String(v) };
  }
  // _bsontype identifies the driver's BSON classes without instanceof, the
  // same way in the driver and in mongosh (mongosh.js keeps a copy of canon).
  switch (v._bsontype) {
    case 'ObjectId': return { $oid: v.toHexString() };
    case 'Long': return { $numberLong: v.toString() };
    case 'Double': return { $numberDouble: String(v.valueOf()) };
    case 'Int32': return { $numberInt: String(v.valueOf()) };
    case 'Binary': return { $binary: Buffer.from(v.buffer).toString('base64'), subType: v.sub_type };
    case 'Timestamp': return { $timestamp: v.toString() };
    case undefined: break;
    default: return { $other: v._bsontype, repr: String(v) };
  }
  if (v instanceof Date) return { $date: v.toISOString() };
  if (v instanceof Map) return canon(Object.fromEntries(v));
  if (typeof v === 'object') {
    const out = {};
    for (const [k, x] of Object.entries(v)) out[k] = canon(x);
    return out;
  }
  return { $other: typeof v, repr: String(v) };
}

function errorDoc(e) {
  const doc = { type: e.constructor.name, code: e.code ?? null, codeName: e.codeName ?? null, message: e.message };
  if (e.writeErrors !== undefined) {
    const we = Array.isArray(e.writeErrors) ? e.writeErrors : [e.writeErrors];
    doc.writeErrors = we.map((w) => ({ index: w.index, code: w.code, errmsg: w.errmsg }));
  }
  if (e.result !== undefined && typeof e.result === 'object') {
    const r = e.result;
    doc.result = canon({
      insertedCount: r.insertedCount, matchedCount: r.matchedCount, modifiedCount: r.modifiedCount,
      deletedCount: r.deletedCount, upsertedCount: r.upsertedCount, insertedIds: r.insertedIds,
      upsertedIds: r.upsertedIds,
    });
  }
  if (e.keyPattern !== undefined) doc.keyPattern = canon(e.keyPattern);
  if (e.keyValue !== undefined) doc.keyValue = canon(e.keyValue);
  return doc;
}

const steps = [];

async function step(name, fn) {
  try {
    steps.push({ name, result: canon(await fn()) });
  } catch (e) {
    if (!(e instanceof MongoError)) throw e;
    steps.push({ name, error: errorDoc(e) });
  }
}

function bulkResult(r) {
  return {
    insertedCount: r.insertedCount, matchedCount: r.matchedCount, modifiedCount: r.modifiedCount,
    deletedCount: r.deletedCount, upsertedCount: r.upsertedCount, insertedIds: r.insertedIds,
    upsertedIds: r.upsertedIds,
  };
}

async function main() {
  const [uri, dbname] = process.argv.slice(2);
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 20000, appName: 'lockgate-compat-node' });
  await client.connect();
  const db = client.db(dbname);
  await db.dropDatabase();
  const coll = db.collection('items');
  const admin = client.db('admin');

  await step('hello', () => admin.command({ hello: 1 }));
  await step('isMaster', () => admin.command({ isMaster: 1 }));
  await step('ping', () => admin.command({ ping: 1 }));
  await step('buildInfo', () => admin.command({ buildInfo: 1 }));
  // What the driver concluded about the deployment from the handshake:
  // through the proxy it must be what it is directly.
  await step('driverView', async () => ({ topologyType: client.topology.description.type }));

  await step('insertOne_autoId', () => coll.insertOne({ kind: 'auto', n: -1 }));
  await step('insertOne', () => coll.insertOne({
    _id: 0, kind: 'fixed', n: 0, oid: new ObjectId('000000000000000000000001'),
    when: new Date(Date.UTC(2020, 0, 2, 3, 4, 5, 6)), big: Long.fromNumber(2 ** 40),
    f: new Double(1.5), bin: new Binary(Buffer.from([0, 1, 2])), nested: { a: [1, 'two', null] },
  }));
  const many = [];
  for (let i = 1; i <= 30; i++) many.push({ _id: i, kind: 'many', n: i, grp: `g${i % 3}`, pad: 'x'.repeat(i) });
  await step('insertMany', () => coll.insertMany(many));
  await step('find_sort_projection_limit', () =>
    coll.find({ kind: 'many' }, { projection: { _id: 1, n: 1, grp: 1 } }).sort({ n: -1 }).limit(7).toArray());
  await step('find_batchSize_getMore', () => coll.find({ kind: 'many' }).sort({ _id: 1 }).batchSize(4).toArray());
  await step('cursor_close_early', async () => {
    const cur = coll.find({ kind: 'many' }).sort({ _id: 1 }).batchSize(2);
    const got = [await cur.next(), await cur.next(), await cur.next()];
    await cur.close();
    return { got, closed: cur.closed };
  });
  await step('countDocuments', () => coll.countDocuments({ kind: 'many', n: { $gte: 10 } }));
  await step('aggregate_group', () => coll.aggregate([
    { $match: { kind: 'many' } },
    { $group: { _id: '$grp', count: { $sum: 1 }, total: { $sum: '$n' } } },
    { $sort: { _id: 1 } },
  ]).toArray());
  await step('updateOne', () => coll.updateOne({ _id: 1 }, { $set: { updated: true }, $inc: { n: 100 } }));
  await step('updateOne_upsert', () => coll.updateOne({ _id: 100 }, { $set: { kind: 'upserted' } }, { upsert: true }));
  await step('updateMany', () => coll.updateMany({ grp: 'g1' }, { $set: { flag: 'g1' } }));
  await step('replaceOne', () => coll.replaceOne({ _id: 2 }, { kind: 'replaced', n: 2 }));
  await step('replaceOne_upsert', () => coll.replaceOne({ _id: 101 }, { kind: 'replaced-upsert' }, { upsert: true }));
  await step('deleteOne', () => coll.deleteOne({ _id: 3 }));
  await step('deleteMany', () => coll.deleteMany({ grp: 'g2', n: { $gt: 20 } }));
  await step('findOneAndUpdate', () => coll.findOneAndUpdate({ _id: 4 }, { $inc: { n: 1000 } }, { returnDocument: 'after' }));
  await step('findOneAndReplace', () => coll.findOneAndReplace({ _id: 5 }, { kind: 'far', n: 5 }, { returnDocument: 'before' }));
  await step('findOneAndDelete', () => coll.findOneAndDelete({ _id: 6 }, { includeResultMetadata: true }));
  await step('bulkWrite_ordered', async () => bulkResult(await coll.bulkWrite([
    { insertOne: { document: { _id: 200, kind: 'bulk' } } },
    { updateOne: { filter: { _id: 200 }, update: { $set: { n: 200 } } } },
    { updateMany: { filter: { kind: 'bulk' }, update: { $set: { seen: true } } } },
    { replaceOne: { filter: { _id: 7 }, replacement: { kind: 'bulk-replaced' } } },
    { deleteOne: { filter: { _id: 8 } } },
    { deleteMany: { filter: { _id: { $in: [9, 10] } } } },
    { insertOne: { document: { _id: 201, kind: 'bulk' } } },
  ], { ordered: true })));
  await step('bulkWrite_ordered_error', async () => bulkResult(await coll.bulkWrite([
    { insertOne: { document: { _id: 300, kind: 'bulk2' } } },
    { insertOne: { document: { _id: 300, kind: 'bulk2-dup' } } },
    { insertOne: { document: { _id: 301, kind: 'bulk2-not-reached' } } },
  ], { ordered: true })));
  await step('bulkWrite_unordered_error', async () => bulkResult(await coll.bulkWrite([
    { insertOne: { document: { _id: 400, kind: 'bulk3' } } },
    { insertOne: { document: { _id: 400, kind: 'bulk3-dup' } } },
    { updateOne: { filter: { _id: 400 }, update: { $set: { n: 400 } } } },
    { insertOne: { document: { _id: 401, kind: 'bulk3-reached' } } },
  ], { ordered: false })));
  await step('createIndex', () => coll.createIndex({ grp: 1, n: -1 }, { name: 'grp_n' }));
  await step('createIndex_unique', () => coll.createIndex({ uniq: 1 }, { unique: true, sparse: true, name: 'uniq_1' }));
  await step('listIndexes', async () => (await coll.listIndexes().toArray()).sort((a, b) => (a.name < b.name ? -1 : 1)));
  await step('duplicateKey', () => coll.insertOne({ _id: 0, kind: 'dup' }));
  await step('duplicateKey_unique_index', () => coll.insertMany([{ _id: 500, uniq: 'u' }, { _id: 501, uniq: 'u' }]));
  await step('session', async () => {
    const s = client.startSession();
    try {
      const insert = await coll.insertOne({ _id: 600, kind: 'session' }, { session: s });
      const find = await coll.findOne({ _id: 600 }, { session: s });
      const ping = await db.command({ ping: 1 }, { session: s });
      const count = await db.command({ count: 'items', query: { kind: 'session' } }, { session: s });
      return { insert, find, ping, count };
    } finally {
      await s.endSession();
    }
  });
  await step('final_state', () => coll.find({}).sort({ _id: 1 }).toArray());
  await step('drop', () => db.dropCollection('items'));

  await client.close();
  process.stdout.write(JSON.stringify({ client: `node mongodb ${pkg.version}`, steps }, null, 1) + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
