"""Drives pymongo through the capture relay (python3-pymongo 3.x sends an
OP_QUERY isMaster handshake, then OP_MSG)."""
import sys

import pymongo
from pymongo import UpdateOne, DeleteOne

client = pymongo.MongoClient(sys.argv[1], maxPoolSize=1, serverSelectionTimeoutMS=10000)
coll = client.capture.pyitems
coll.drop()
coll.insert_one({"_id": 1, "name": "one"})
coll.insert_many([{"_id": i, "n": i} for i in range(2, 12)])
print(len(list(coll.find({}, batch_size=4).limit(6))))
coll.update_one({"_id": 1}, {"$set": {"name": "uno"}})
coll.delete_one({"_id": 2})
coll.bulk_write([UpdateOne({"_id": 3}, {"$inc": {"n": 1}}), DeleteOne({"_id": 4})])
coll.find_one_and_update({"_id": 5}, {"$set": {"locked": True}})
with client.start_session() as s:
    coll.update_one({"_id": 6}, {"$set": {"owner": "s1"}}, session=s)
client.close()
