#!/usr/bin/python3
"""lockgate enforcement checks for pymongo.

Usage: /usr/bin/python3 enforce.py <proxy-uri> <direct-uri> <database>

Every collection of <database> is enforced by the proxy. The script seeds
each collection through the DIRECT connection, runs every write API through
the PROXY, and prints one JSON line per check:

  {"case": "...", "error": null | {...}, "result": null | "<ejson>",
   "before": "<ejson>", "after": "<ejson>"}

before/after are the whole collection read directly (sorted by _id), as
canonical extended JSON: {"docs": [...]}. The script judges nothing; the Go
test (tests/enforcement/enforce_test.go) holds the expectations. The
operations and their arguments must stay identical to node/enforce.js.
"""

import datetime
import json
import sys
import time

import pymongo
from bson import json_util
from bson.binary import Binary
from bson.int64 import Int64
from bson.son import SON
from pymongo import DeleteOne, InsertOne, ReplaceOne, ReturnDocument, UpdateOne
from pymongo.errors import AutoReconnect, BulkWriteError, PyMongoError
from pymongo.write_concern import WriteConcern

CANON = json_util.CANONICAL_JSON_OPTIONS
HOLDER_APP = "enf-pymongo-holder"
CALLER_APP = "enf-pymongo-caller"
LOCK_IDS = [1, 2, 3, 4, 5, 6, 100, 200, 201, 202, 203]


def ejson(v):
    return json_util.dumps(v, json_options=CANON)


def seed_docs():
    docs = []
    for i in range(1, 7):
        docs.append({
            "_id": i,
            "status": "open" if i <= 3 else "closed",
            "qty": 10 * i,
            "sku": "abcdef"[i - 1],
            "n64": Int64(i << 40),
            "price": i + 0.5,
            "when": datetime.datetime(2020, 1, i, 3, 4, 5, 6000),
            "tags": ["t%d" % i, i],
            "nested": {"k": i, "b": Binary(bytes([i]))},
        })
    return docs


def snapshot(coll):
    return ejson({"docs": list(coll.find({}, sort=[("_id", 1)]))})


def error_doc(e):
    doc = {"type": type(e).__name__, "code": getattr(e, "code", None), "codeName": None,
           "errmsg": str(e), "detail": None, "raw": None}
    details = getattr(e, "details", None)
    if isinstance(details, dict):
        doc["raw"] = ejson(details)
        doc["codeName"] = details.get("codeName")
        doc["errmsg"] = details.get("errmsg", str(e))
        if details.get("lockgate") is not None:
            doc["detail"] = ejson(details["lockgate"])
        if isinstance(e, BulkWriteError) and details.get("writeErrors"):
            # A per-statement error: surface the first one like a command
            # error, keeping the whole reply in raw.
            we = details["writeErrors"][0]
            doc["code"] = we.get("code")
            doc["codeName"] = we.get("codeName")
            doc["errmsg"] = we.get("errmsg")
    return doc


def write_result(r):
    out = {}
    for attr, key in (("matched_count", "matched"), ("modified_count", "modified"),
                      ("deleted_count", "deleted"), ("inserted_count", "inserted"),
                      ("upserted_count", "upserted")):
        if hasattr(r, attr):
            out[key] = getattr(r, attr)
    if getattr(r, "upserted_id", None) is not None:
        out["upsertedId"] = r.upserted_id
    return out


def doc_result(d):
    return {"doc": d}


def check(name, coll_direct, fn):
    before = snapshot(coll_direct)
    err, res = None, None
    try:
        res = ejson(fn())
    except PyMongoError as e:
        err = error_doc(e)
    after = snapshot(coll_direct)
    print(json.dumps({"case": name, "error": err, "result": res, "before": before, "after": after}), flush=True)


def write_apis(c, s):
    """Every write API, in the order enforce_test.go expects (writeAPIs).

    In the "own" situation they run one after another on one collection, so
    each one's expected effect depends on the ones before it.
    """
    return [
        ("update_one", lambda: write_result(c.update_one({"_id": 1}, {"$set": {"qty": 11}}, session=s))),
        ("update_many_pinned", lambda: write_result(c.update_many(
            {"_id": {"$in": [1, 2]}}, {"$set": {"flag": "m"}}, session=s))),
        ("update_many_unpinned", lambda: write_result(c.update_many(
            {"status": "open"}, {"$set": {"seen": True}}, session=s))),
        ("replace_one", lambda: write_result(c.replace_one(
            {"_id": 2}, {"status": "open", "qty": 22, "sku": "b2"}, session=s))),
        ("find_one_and_update", lambda: doc_result(c.find_one_and_update(
            {"_id": 4}, {"$set": {"qty": 44}}, return_document=ReturnDocument.AFTER, session=s))),
        ("find_one_and_replace_unpinned", lambda: doc_result(c.find_one_and_replace(
            {"sku": "e"}, {"status": "closed", "qty": 55, "sku": "e2"}, session=s))),
        ("find_one_and_delete", lambda: doc_result(c.find_one_and_delete({"_id": 6}, session=s))),
        ("delete_one", lambda: write_result(c.delete_one({"_id": 3}, session=s))),
        # Drivers send a bulk write as one command per run of operations of
        # one kind: here update (UpdateOne + ReplaceOne), delete, insert.
        # Ordered, the first refused command stops the bulk write, so the
        # insert at the end (which the policy would allow) is never sent and
        # "nothing changed" is the right expectation without a lock.
        ("bulk_write_ordered", lambda: write_result(c.bulk_write([
            UpdateOne({"_id": 1}, {"$set": {"bulk": "u"}}),
            ReplaceOne({"_id": 2}, {"status": "open", "qty": 222, "sku": "b3"}),
            DeleteOne({"_id": 4}),
            InsertOne({"_id": 100, "status": "new"}),
        ], ordered=True, session=s))),
        # Unordered, every command is sent even after a refusal; there is
        # no insert in it, so again nothing may change without the locks.
        ("bulk_write_unordered", lambda: write_result(c.bulk_write([
            UpdateOne({"_id": 5}, {"$set": {"bulk": "v"}}),
            DeleteOne({"_id": 100}),
        ], ordered=False, session=s))),
        ("upsert_pinned", lambda: write_result(c.update_one(
            {"_id": 200}, {"$set": {"status": "new", "qty": 200}}, upsert=True, session=s))),
        ("upsert_unpinned_match", lambda: write_result(c.update_one(
            {"sku": "a"}, {"$set": {"via": "upsert"}}, upsert=True, session=s))),
        ("upsert_unpinned_setOnInsert_id", lambda: write_result(c.update_one(
            {"sku": "zz"}, {"$set": {"status": "new"}, "$setOnInsert": {"_id": 201}}, upsert=True, session=s))),
        # The same _id in other numeric types is the same lock.
        ("update_many_mixed_numeric_ids", lambda: write_result(c.update_many(
            {"_id": {"$in": [Int64(1), 2.0]}}, {"$set": {"num": "x"}}, session=s))),
        ("replace_one_upsert_unpinned", lambda: write_result(c.replace_one(
            {"sku": "q"}, {"_id": 202, "sku": "q", "status": "new"}, upsert=True, session=s))),
        ("find_one_and_update_upsert_pinned", lambda: doc_result(c.find_one_and_update(
            {"_id": 203}, {"$set": {"status": "new"}}, upsert=True,
            return_document=ReturnDocument.AFTER, session=s))),
        ("delete_many_unpinned", lambda: write_result(c.delete_many({"status": "closed"}, session=s))),
    ]


def unacknowledged(db, coll):
    r = db[coll].with_options(write_concern=WriteConcern(w=0)).update_one({"_id": 1}, {"$set": {"qty": 999}})
    # Long enough for the write to land if it had been forwarded.
    time.sleep(0.5)
    ping = "ok"
    try:
        db.command("ping")
    except AutoReconnect:
        db.command("ping")
        ping = "ok_after_retry"
    return {"acknowledged": r.acknowledged, "ping": ping}


def seed(direct_db, name):
    direct_db.drop_collection(name)
    direct_db[name].insert_many(seed_docs())
    return direct_db[name]


def lock(db, s, coll, ids):
    return db.command(SON([("acquireLock", coll), ("ids", ids), ("leaseMS", 60000)]), session=s)


def main():
    proxy_uri, direct_uri, dbname = sys.argv[1], sys.argv[2], sys.argv[3]
    direct = pymongo.MongoClient(direct_uri, serverSelectionTimeoutMS=20000)
    caller = pymongo.MongoClient(proxy_uri, serverSelectionTimeoutMS=20000, appname=CALLER_APP)
    holder = pymongo.MongoClient(proxy_uri, serverSelectionTimeoutMS=20000, appname=HOLDER_APP)
    ddb, cdb, hdb = direct[dbname], caller[dbname], holder[dbname]

    # (1) No lock at all, no explicit session (the driver's implicit
    # session still sends an lsid): every write is refused.
    dc = seed(ddb, "nolock")
    for name, fn in write_apis(cdb["nolock"], None):
        check("nolock/" + name, dc, fn)
    # An unacknowledged (w=0) write: the driver sends it with moreToCome
    # and no lsid (sessions are not used for unacknowledged writes), so it
    # cannot hold locks and is refused; with no reply to carry the error,
    # the proxy closes the connection. Nothing may be written, and the
    # client must go on working (a ping, retried once after the closed
    # connection).
    check("nolock/unacknowledged_update_one", dc, lambda: unacknowledged(cdb, "nolock"))

    # (2) Locked by another session, of another application: the caller's
    # explicit session is refused and told who holds the lock.
    dc = seed(ddb, "other")
    with holder.start_session() as hs:
        check("other/holder_acquireLock", dc, lambda: lock(hdb, hs, "other", LOCK_IDS))
        with caller.start_session() as s:
            for name, fn in write_apis(cdb["other"], s):
                check("other/" + name, dc, fn)
        check("other/holder_releaseLock", dc, lambda: hdb.command(SON([("releaseLock", "other")]), session=hs))

    # (3) Locked by the caller's own explicit session, writes passed that
    # session: applied.
    dc = seed(ddb, "own")
    with caller.start_session() as s:
        check("own/acquireLock", dc, lambda: lock(cdb, s, "own", LOCK_IDS))
        check("own/renewLock", dc, lambda: cdb.command(SON([("renewLock", "own"), ("ids", LOCK_IDS), ("leaseMS", 60000)]), session=s))
        check("own/lockStatus", dc, lambda: cdb.command(SON([("lockStatus", "own"), ("ids", LOCK_IDS)]), session=s))
        for name, fn in write_apis(cdb["own"], s):
            check("own/" + name, dc, fn)
        check("own/releaseLock", dc, lambda: cdb.command(SON([("releaseLock", "own")]), session=s))

    # Pinning, visibly: ids 1..3 ("open") are locked; doc 4, "open" too, is
    # inserted directly (not through the proxy) and not locked, so
    # update_many({status: "open"}) must be refused whole; once doc 4 is
    # gone (deleted directly) it applies to exactly 1..3.
    dc = seed(ddb, "pin")
    dc.delete_many({"_id": {"$gte": 4}})
    dc.insert_one({"_id": 4, "status": "open", "qty": 40})
    with caller.start_session() as s:
        check("pin/acquireLock", dc, lambda: lock(cdb, s, "pin", [1, 2, 3]))
        upd = lambda: write_result(cdb["pin"].update_many({"status": "open"}, {"$set": {"status": "done"}}, session=s))
        check("pin/unlocked_match_refused", dc, upd)
        dc.delete_one({"_id": 4})
        check("pin/locked_matches_applied", dc, upd)
        check("pin/releaseLock", dc, lambda: cdb.command(SON([("releaseLock", "pin")]), session=s))

    # Reference: the unpinned upsert sent DIRECTLY to the server, so the
    # test can show what the document it inserts must look like.
    dc = seed(ddb, "reference")
    check("direct/upsert_unpinned_setOnInsert_id", dc, lambda: write_result(dc.update_one(
        {"sku": "zz"}, {"$set": {"status": "new"}, "$setOnInsert": {"_id": 201}}, upsert=True)))

    for c in (caller, holder, direct):
        c.close()


if __name__ == "__main__":
    main()
