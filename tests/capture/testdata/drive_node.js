// Drives the Node.js driver through the capture relay.
const { MongoClient } = require('mongodb');

async function main() {
  const client = new MongoClient(process.argv[2], { maxPoolSize: 1 });
  await client.connect();
  const coll = client.db('capture').collection('nodeitems');
  await coll.drop().catch(() => {});
  await coll.insertOne({ _id: 1, name: 'one' });
  await coll.insertMany([2, 3, 4, 5, 6, 7, 8, 9].map((i) => ({ _id: i, n: i })));
  const cur = coll.find({}, { batchSize: 3 });
  for (let i = 0; i < 5; i++) await cur.next();
  await cur.close();
  await coll.updateOne({ _id: 1 }, { $set: { name: 'uno' } });
  await coll.deleteOne({ _id: 2 });
  await coll.bulkWrite([{ updateOne: { filter: { _id: 3 }, update: { $inc: { n: 1 } } } }, { deleteOne: { filter: { _id: 4 } } }]);
  await coll.findOneAndUpdate({ _id: 5 }, { $set: { locked: true } });
  const s = client.startSession();
  await coll.updateOne({ _id: 6 }, { $set: { owner: 's1' } }, { session: s });
  await s.endSession();
  await client.close();
}
main().catch((e) => { console.error(e); process.exit(1); });
