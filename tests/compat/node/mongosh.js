// lockgate compatibility script for mongosh.
//
// Usage: mongosh "<mongodb-uri-with-database>" --quiet --norc --file mongosh.js
//
// The database is the one named in the connection string (dropped first).
// Prints one JSON document: {"client": ..., "steps": [...]}; each step is
// {"name", "result"} or {"name", "error"}. tests/compat_test.go runs it
// directly against the upstream and through the proxy and requires identical
// output after the normalisation documented there. Nothing is normalised
// here; canon() keeps BSON type information (it mirrors canon() in compat.js).

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
  switch (v._bsontype) {
    case 'ObjectId': return { $oid: v.toHexString() };
    case 'Long': return { $numberLong: v.toString() };
    case 'Double': return { $numberDouble: String(v.valueOf()) };
    case 'Int32': return { $numberInt: String(v.valueOf()) };
    case 'Binary': return { $binary: v.toString('base64'), subType: v.sub_type };
    case 'Timestamp': return { $timestamp: v.toString() };
    case undefined: break;
    default: return { $other: v._bsontype, repr: String(v) };
  }
  if (v instanceof Date) return { $date: v.toISOString() };
  if (typeof v === 'object') {
    const out = {};
    for (const k of Object.keys(v)) out[k] = canon(v[k]);
    return out;
  }
  return { $other: typeof v, repr: String(v) };
}

function errorDoc(e) {
  const doc = { type: e.name, code: e.code === undefined ? null : e.code, codeName: e.codeName === undefined ? null : e.codeName, message: e.message };
  if (e.writeErrors !== undefined) {
    const we = Array.isArray(e.writeErrors) ? e.writeErrors : [e.writeErrors];
    doc.writeErrors = we.map((w) => ({ index: w.index, code: w.code, errmsg: w.errmsg }));
  }
  if (e.result !== undefined && e.result !== null && typeof e.result === 'object') {
    const r = e.result;
    doc.result = canon({
      insertedCount: r.insertedCount, matchedCount: r.matchedCount, modifiedCount: r.modifiedCount,
      deletedCount: r.deletedCount, upsertedCount: r.upsertedCount,
    });
  }
  return doc;
}

const steps = [];

function step(name, fn) {
  try {
    steps.push({ name, result: canon(fn()) });
  } catch (e) {
    if (e.code === undefined && e.writeErrors === undefined) throw e;
    steps.push({ name, error: errorDoc(e) });
  }
}

// A mongosh result object carries shell-only helpers; keep the data fields.
function plain(r) {
  return JSON.parse(JSON.stringify(canon(r)));
}

db.dropDatabase();
const coll = db.items;

step('hello', () => db.adminCommand({ hello: 1 }));
step('isMaster', () => db.adminCommand({ isMaster: 1 }));
step('ping', () => db.runCommand({ ping: 1 }));
step('buildInfo', () => db.adminCommand({ buildInfo: 1 }));
// The shell's view of the deployment, as it decides it (from hello).
step('driverView', () => ({ isMongos: db.hello().msg === 'isdbgrid' }));

step('insertOne_autoId', () => plain(coll.insertOne({ kind: 'auto', n: -1 })));
step('insertOne', () => plain(coll.insertOne({
  _id: 0, kind: 'fixed', n: 0, oid: ObjectId('000000000000000000000001'),
  when: ISODate('2020-01-02T03:04:05.006Z'), big: NumberLong('1099511627776'),
  f: Double(1.5), bin: BinData(0, 'AAEC'), nested: { a: [1, 'two', null] },
})));
const many = [];
for (let i = 1; i <= 30; i++) many.push({ _id: i, kind: 'many', n: i, grp: `g${i % 3}`, pad: 'x'.repeat(i) });
step('insertMany', () => plain(coll.insertMany(many)));
step('find_sort_projection_limit', () =>
  coll.find({ kind: 'many' }, { _id: 1, n: 1, grp: 1 }).sort({ n: -1 }).limit(7).toArray());
step('find_batchSize_getMore', () => coll.find({ kind: 'many' }).sort({ _id: 1 }).batchSize(4).toArray());
step('cursor_close_early', () => {
  const cur = coll.find({ kind: 'many' }).sort({ _id: 1 }).batchSize(2);
  const got = [cur.next(), cur.next(), cur.next()];
  cur.close();
  return { got, closed: cur.isClosed() };
});
step('countDocuments', () => coll.countDocuments({ kind: 'many', n: { $gte: 10 } }));
step('aggregate_group', () => coll.aggregate([
  { $match: { kind: 'many' } },
  { $group: { _id: '$grp', count: { $sum: 1 }, total: { $sum: '$n' } } },
  { $sort: { _id: 1 } },
]).toArray());
step('updateOne', () => plain(coll.updateOne({ _id: 1 }, { $set: { updated: true }, $inc: { n: 100 } })));
step('updateOne_upsert', () => plain(coll.updateOne({ _id: 100 }, { $set: { kind: 'upserted' } }, { upsert: true })));
step('updateMany', () => plain(coll.updateMany({ grp: 'g1' }, { $set: { flag: 'g1' } })));
step('replaceOne', () => plain(coll.replaceOne({ _id: 2 }, { kind: 'replaced', n: 2 })));
step('replaceOne_upsert', () => plain(coll.replaceOne({ _id: 101 }, { kind: 'replaced-upsert' }, { upsert: true })));
step('deleteOne', () => plain(coll.deleteOne({ _id: 3 })));
step('deleteMany', () => plain(coll.deleteMany({ grp: 'g2', n: { $gt: 20 } })));
step('findOneAndUpdate', () => coll.findOneAndUpdate({ _id: 4 }, { $inc: { n: 1000 } }, { returnNewDocument: true }));
step('findOneAndReplace', () => coll.findOneAndReplace({ _id: 5 }, { kind: 'far', n: 5 }));
step('findOneAndDelete', () => coll.findOneAndDelete({ _id: 6 }));
step('bulkWrite_ordered', () => plain(coll.bulkWrite([
  { insertOne: { document: { _id: 200, kind: 'bulk' } } },
  { updateOne: { filter: { _id: 200 }, update: { $set: { n: 200 } } } },
  { updateMany: { filter: { kind: 'bulk' }, update: { $set: { seen: true } } } },
  { replaceOne: { filter: { _id: 7 }, replacement: { kind: 'bulk-replaced' } } },
  { deleteOne: { filter: { _id: 8 } } },
  { deleteMany: { filter: { _id: { $in: [9, 10] } } } },
  { insertOne: { document: { _id: 201, kind: 'bulk' } } },
], { ordered: true })));
step('bulkWrite_ordered_error', () => plain(coll.bulkWrite([
  { insertOne: { document: { _id: 300, kind: 'bulk2' } } },
  { insertOne: { document: { _id: 300, kind: 'bulk2-dup' } } },
  { insertOne: { document: { _id: 301, kind: 'bulk2-not-reached' } } },
], { ordered: true })));
step('bulkWrite_unordered_error', () => plain(coll.bulkWrite([
  { insertOne: { document: { _id: 400, kind: 'bulk3' } } },
  { insertOne: { document: { _id: 400, kind: 'bulk3-dup' } } },
  { updateOne: { filter: { _id: 400 }, update: { $set: { n: 400 } } } },
  { insertOne: { document: { _id: 401, kind: 'bulk3-reached' } } },
], { ordered: false })));
step('createIndex', () => coll.createIndex({ grp: 1, n: -1 }, { name: 'grp_n' }));
step('createIndex_unique', () => coll.createIndex({ uniq: 1 }, { unique: true, sparse: true, name: 'uniq_1' }));
step('listIndexes', () => coll.getIndexes().sort((a, b) => (a.name < b.name ? -1 : 1)));
step('duplicateKey', () => plain(coll.insertOne({ _id: 0, kind: 'dup' })));
step('duplicateKey_unique_index', () => plain(coll.insertMany([{ _id: 500, uniq: 'u' }, { _id: 501, uniq: 'u' }])));
step('session', () => {
  const s = db.getMongo().startSession();
  try {
    const sdb = s.getDatabase(db.getName());
    const insert = plain(sdb.items.insertOne({ _id: 600, kind: 'session' }));
    const find = sdb.items.findOne({ _id: 600 });
    const ping = sdb.runCommand({ ping: 1 });
    const count = sdb.runCommand({ count: 'items', query: { kind: 'session' } });
    return { insert, find, ping, count };
  } finally {
    s.endSession();
  }
});
step('final_state', () => coll.find({}).sort({ _id: 1 }).toArray());
step('drop', () => coll.drop());

print(JSON.stringify({ client: `mongosh ${version()}`, steps }, null, 1));
