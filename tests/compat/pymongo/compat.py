#!/usr/bin/python3
"""lockgate compatibility script for pymongo.

Usage: /usr/bin/python3 compat.py <mongodb-uri> <database>

Runs a fixed sequence of operations against <database> (dropped first) and
prints one JSON document to stdout: {"client": ..., "steps": [...]}. Each
step is {"name": ..., "result": ...} or {"name": ..., "error": {...}}.

The Go test tests/compat_test.go runs this script twice, directly against
the upstream and through the proxy, and requires the two outputs to be
identical after the normalisation it documents. The script itself does not
normalise anything: BSON values that JSON cannot express are written in a
typed form ({"$oid": ...}, {"$date": ...}, {"$numberLong": ...}, ...) so that
a type change through the proxy shows up as a difference.
"""

import base64
import datetime
import json
import sys

import bson
import pymongo
from bson.int64 import Int64
from bson.objectid import ObjectId
from pymongo import (DeleteMany, DeleteOne, InsertOne, ReplaceOne,
                     ReturnDocument, UpdateMany, UpdateOne)
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError


def canon(v):
    """Converts a decoded BSON value to JSON, keeping type information."""
    if isinstance(v, dict):
        return {str(k): canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, Int64):
        return {"$numberLong": str(int(v))}
    if isinstance(v, int):
        return {"$numberInt": str(v)}
    if isinstance(v, float):
        return {"$numberDouble": repr(v)}
    if isinstance(v, ObjectId):
        return {"$oid": str(v)}
    if isinstance(v, datetime.datetime):
        return {"$date": v.isoformat()}
    if isinstance(v, bytes):
        return {"$binary": base64.b64encode(v).decode()}
    if isinstance(v, bson.binary.Binary):
        return {"$binary": base64.b64encode(bytes(v)).decode(), "subType": v.subtype}
    return {"$other": type(v).__name__, "repr": repr(v)}


def error_doc(e):
    doc = {"type": type(e).__name__}
    if isinstance(e, BulkWriteError):
        doc["details"] = canon(e.details)
    elif isinstance(e, OperationFailure):
        doc["code"] = e.code
        doc["details"] = canon(e.details)
    else:
        doc["message"] = str(e)
    if getattr(e, "code", None) is not None:
        doc["code"] = e.code
    return doc


steps = []


def step(name, fn):
    try:
        steps.append({"name": name, "result": canon(fn())})
    except PyMongoError as e:
        steps.append({"name": name, "error": error_doc(e)})


def write_result(r):
    out = {"acknowledged": r.acknowledged}
    for attr in ("inserted_id", "inserted_ids", "matched_count", "modified_count",
                 "upserted_id", "deleted_count"):
        if hasattr(r, attr):
            out[attr] = getattr(r, attr)
    return out


def bulk_result(r):
    return {"acknowledged": r.acknowledged, "bulk_api_result": r.bulk_api_result}


def main():
    uri, dbname = sys.argv[1], sys.argv[2]
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, appname="lockgate-compat-pymongo")
    db = client[dbname]
    client.drop_database(dbname)
    coll = db["items"]

    # Handshake: pymongo 3.11 sends its first isMaster as OP_QUERY; these two
    # go over OP_MSG.
    step("hello", lambda: client.admin.command("hello"))
    step("isMaster", lambda: client.admin.command("isMaster"))
    step("ping", lambda: client.admin.command("ping"))
    step("buildInfo", lambda: client.admin.command("buildInfo"))
    # What the driver concluded about the deployment from the handshake:
    # through the proxy it must be what it is directly.
    step("driverView", lambda: {"is_mongos": client.is_mongos, "is_primary": client.is_primary})

    step("insertOne_autoId", lambda: write_result(coll.insert_one({"kind": "auto", "n": -1})))
    step("insertOne", lambda: write_result(coll.insert_one(
        {"_id": 0, "kind": "fixed", "n": 0, "oid": ObjectId("000000000000000000000001"),
         "when": datetime.datetime(2020, 1, 2, 3, 4, 5, 6000), "big": Int64(1 << 40),
         "f": 1.5, "bin": bson.binary.Binary(b"\x00\x01\x02"), "nested": {"a": [1, "two", None]}})))
    step("insertMany", lambda: write_result(coll.insert_many(
        [{"_id": i, "kind": "many", "n": i, "grp": "g%d" % (i % 3), "pad": "x" * i}
         for i in range(1, 31)])))
    step("find_sort_projection_limit", lambda: list(coll.find(
        {"kind": "many"}, {"_id": 1, "n": 1, "grp": 1}).sort("n", pymongo.DESCENDING).limit(7)))
    step("find_batchSize_getMore", lambda: list(coll.find({"kind": "many"}).sort("_id", 1).batch_size(4)))

    def close_early():
        cur = coll.find({"kind": "many"}).sort("_id", 1).batch_size(2)
        got = [next(cur), next(cur), next(cur)]
        cur.close()
        return {"got": got, "alive": cur.alive}
    step("cursor_close_early", close_early)
    step("countDocuments", lambda: coll.count_documents({"kind": "many", "n": {"$gte": 10}}))
    step("aggregate_group", lambda: list(coll.aggregate([
        {"$match": {"kind": "many"}},
        {"$group": {"_id": "$grp", "count": {"$sum": 1}, "total": {"$sum": "$n"}}},
        {"$sort": {"_id": 1}}])))
    step("updateOne", lambda: write_result(coll.update_one({"_id": 1}, {"$set": {"updated": True}, "$inc": {"n": 100}})))
    step("updateOne_upsert", lambda: write_result(coll.update_one({"_id": 100}, {"$set": {"kind": "upserted"}}, upsert=True)))
    step("updateMany", lambda: write_result(coll.update_many({"grp": "g1"}, {"$set": {"flag": "g1"}})))
    step("replaceOne", lambda: write_result(coll.replace_one({"_id": 2}, {"kind": "replaced", "n": 2})))
    step("replaceOne_upsert", lambda: write_result(coll.replace_one({"_id": 101}, {"kind": "replaced-upsert"}, upsert=True)))
    step("deleteOne", lambda: write_result(coll.delete_one({"_id": 3})))
    step("deleteMany", lambda: write_result(coll.delete_many({"grp": "g2", "n": {"$gt": 20}})))
    step("findOneAndUpdate", lambda: coll.find_one_and_update(
        {"_id": 4}, {"$inc": {"n": 1000}}, return_document=ReturnDocument.AFTER))
    step("findOneAndReplace", lambda: coll.find_one_and_replace(
        {"_id": 5}, {"kind": "far", "n": 5}, return_document=ReturnDocument.BEFORE))
    step("findOneAndDelete", lambda: coll.find_one_and_delete({"_id": 6}))
    step("bulkWrite_ordered", lambda: bulk_result(coll.bulk_write([
        InsertOne({"_id": 200, "kind": "bulk"}),
        UpdateOne({"_id": 200}, {"$set": {"n": 200}}),
        UpdateMany({"kind": "bulk"}, {"$set": {"seen": True}}),
        ReplaceOne({"_id": 7}, {"kind": "bulk-replaced"}),
        DeleteOne({"_id": 8}),
        DeleteMany({"_id": {"$in": [9, 10]}}),
        InsertOne({"_id": 201, "kind": "bulk"}),
    ], ordered=True)))
    step("bulkWrite_ordered_error", lambda: bulk_result(coll.bulk_write([
        InsertOne({"_id": 300, "kind": "bulk2"}),
        InsertOne({"_id": 300, "kind": "bulk2-dup"}),
        InsertOne({"_id": 301, "kind": "bulk2-not-reached"}),
    ], ordered=True)))
    step("bulkWrite_unordered_error", lambda: bulk_result(coll.bulk_write([
        InsertOne({"_id": 400, "kind": "bulk3"}),
        InsertOne({"_id": 400, "kind": "bulk3-dup"}),
        UpdateOne({"_id": 400}, {"$set": {"n": 400}}),
        InsertOne({"_id": 401, "kind": "bulk3-reached"}),
    ], ordered=False)))
    step("createIndex", lambda: coll.create_index([("grp", 1), ("n", -1)], name="grp_n"))
    step("createIndex_unique", lambda: coll.create_index("uniq", unique=True, sparse=True, name="uniq_1"))
    step("listIndexes", lambda: sorted(coll.list_indexes(), key=lambda i: i["name"]))
    step("duplicateKey", lambda: write_result(coll.insert_one({"_id": 0, "kind": "dup"})))
    step("duplicateKey_unique_index", lambda: write_result(coll.insert_many(
        [{"_id": 500, "uniq": "u"}, {"_id": 501, "uniq": "u"}])))

    def session_ops():
        with client.start_session() as s:
            r1 = coll.insert_one({"_id": 600, "kind": "session"}, session=s)
            doc = coll.find_one({"_id": 600}, session=s)
            ping = db.command("ping", session=s)
            cnt = db.command({"count": "items", "query": {"kind": "session"}}, session=s)
            return {"insert": write_result(r1), "find": doc, "ping": ping, "count": cnt}
    step("session", session_ops)
    step("final_state", lambda: list(coll.find({}).sort("_id", 1)))
    step("drop", lambda: db.drop_collection("items"))

    client.close()
    json.dump({"client": "pymongo " + pymongo.version, "steps": steps}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
