#!/usr/bin/python3
"""An application's own advisory locking, written as applications write it.

Usage: /usr/bin/python3 schemes.py <scheme> <mode> <uri> <direct-uri> <db> <coll> [K M rogue]

Documents are seeded and read back through <direct-uri>.

scheme: holderFields | lockDocument | flag
mode:
  work      K worker threads each increment the counter of every hot
            document M times under the scheme's lock (read, then write
            n+1: a double grant loses an increment), while, if rogue is 1,
            a rogue client loops plain updates and deletes that ignore the
            scheme. Prints one JSON object: the final counters, how many
            rogue writes the database applied, what the rogue's refusals
            were, and the distinct outcomes the workers' lock calls saw.
  takeover  a holder takes a lock and vanishes; another client waits for
            the scheme's expiry and takes it over. Prints what each step
            returned.

The acquire/write/release calls translate the C# originals call for call
(docs/SCHEMES.md). The script judges nothing; schemes_test.go does.
"""

import datetime
import json
import os
import sys
import threading
import time
import uuid

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

HOT = [1, 2, 3]
# The rules' leaseMS (holderFields' lock timeout, the flag's and the lock
# records' lease), from schemes_test.go, which scales it with the machine's
# load: one number for the rules and the clients.
LEASE_S = int(os.environ["LOCKGATE_TEST_LEASE_MS"]) / 1000
# The lease a lockgate lock must have left for a write to pass
# (policy.leaseMarginMS of the gateways, twoproxies.LeaseMarginMS).
MARGIN_S = int(os.environ["LOCKGATE_TEST_LEASE_MARGIN_MS"]) / 1000


def now():
    # Millisecond precision, as BSON dates store it.
    t = datetime.datetime.utcnow()
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def outcome(kind, value):
    return "%s:%s" % (kind, value)


class HolderFields:
    """Scheme 1: LockId + LockTime on the document; the C# original:

    FindOneAndUpdate(And(Eq(Id, id), Or(Eq(LockId, null), Lt(LockTime, now - timeout))),
                     Set(LockId, lockId).Set(LockTime, now), {IsUpsert, ReturnDocument.After})
    catch MongoCommandException 11000 -> not acquired
    UpdateOne(And(Eq(Id, id), Eq(LockId, lockId)), Set(LockId, null).Set(LockTime, null))
    """

    def __init__(self, coll):
        self.coll = coll

    def acquire(self, _id, me, seen):
        try:
            doc = self.coll.find_one_and_update(
                {"_id": _id, "$or": [{"LockId": None},
                                     {"LockTime": {"$lt": now() - datetime.timedelta(seconds=LEASE_S)}}]},
                {"$set": {"LockId": me, "LockTime": now()}},
                upsert=True, return_document=ReturnDocument.AFTER)
        except DuplicateKeyError as e:
            seen.add(outcome("acquire_busy", "%s/%s" % (type(e).__name__, e.code)))
            return False
        ok = doc is not None and doc.get("LockId") == me
        seen.add(outcome("acquire", "locked" if ok else "returned_other"))
        return ok

    def write(self, _id, me, n):
        r = self.coll.update_one({"_id": _id, "LockId": me}, {"$set": {"n": n}})
        return r.modified_count

    def release(self, _id, me):
        self.coll.update_one({"_id": _id, "LockId": me}, {"$set": {"LockId": None, "LockTime": None}})


class LockDocument:
    """Scheme 2: Lock: {actor, expiresAt, error}; acquire where there is no
    lock or an expired one, several documents in key order with rollback,
    release clearing the lock (leaving an error when the work failed)."""

    def __init__(self, coll):
        self.coll = coll

    def acquire(self, _id, me, seen, lease=LEASE_S * 10 / 3):
        t = now()
        r = self.coll.update_one(
            {"_id": _id, "$or": [{"Lock.actor": None}, {"Lock.expiresAt": {"$lt": t}}]},
            {"$set": {"Lock": {"actor": me, "expiresAt": t + datetime.timedelta(seconds=lease), "error": None}}})
        seen.add(outcome("acquire", "matched=%d,modified=%d" % (r.matched_count, r.modified_count)))
        return r.modified_count == 1

    def acquire_all(self, ids, me, seen):
        taken = []
        for _id in sorted(ids):
            if not self.acquire(_id, me, seen):
                for t in reversed(taken):  # rollback
                    self.release(t, me)
                return False
            taken.append(_id)
        return True

    def write(self, _id, me, n):
        r = self.coll.update_one({"_id": _id, "Lock.actor": me}, {"$set": {"n": n}})
        return r.modified_count

    def release(self, _id, me, error=None):
        if error is None:
            self.coll.update_one({"_id": _id, "Lock.actor": me}, {"$set": {"Lock": None}})
        else:
            self.coll.update_one({"_id": _id, "Lock.actor": me}, {"$set": {"Lock.actor": None, "Lock.error": error}})


class Flag:
    """Scheme 3: a boolean; acquire is a test-and-set whose modifiedCount
    says who won; the holder clears it."""

    def __init__(self, coll):
        self.coll = coll

    def acquire(self, _id, me, seen):
        r = self.coll.update_one({"_id": _id, "locked": False}, {"$set": {"locked": True}})
        seen.add(outcome("acquire", "matched=%d,modified=%d" % (r.matched_count, r.modified_count)))
        return r.modified_count == 1

    def write(self, _id, me, n):
        r = self.coll.update_one({"_id": _id}, {"$set": {"n": n}})
        return r.modified_count

    def release(self, _id, me):
        self.coll.update_one({"_id": _id}, {"$set": {"locked": False}})


class LockCollection:
    """Scheme 4: a lock collection next to the data ("<coll>.lock"): a
    record {_id: <document _id>, ts, aid} per lock; insert to acquire
    (DuplicateKey: busy), or upsert with $setOnInsert and treat "not
    inserted" as busy; release deletes by _id or all of a holder's by aid."""

    def __init__(self, coll, upsert=False):
        self.coll = coll
        self.locks = coll.database[coll.name + ".lock"]
        self.upsert = upsert

    def acquire(self, _id, me, seen):
        if self.upsert:
            try:
                r = self.locks.update_one({"_id": _id}, {"$setOnInsert": {"ts": now(), "aid": me}}, upsert=True)
            except DuplicateKeyError:
                # Two upserts racing to insert: the loser is busy (MongoDB
                # documents this for concurrent upserts too).
                seen.add(outcome("acquire_upsert", "duplicate"))
                return False
            ok = r.upserted_id is not None
            seen.add(outcome("acquire_upsert", "inserted" if ok else "matched=%d" % r.matched_count))
            return ok
        try:
            self.locks.insert_one({"_id": _id, "ts": now(), "aid": me})
        except DuplicateKeyError as e:
            seen.add(outcome("acquire_busy", "%s/%s" % (type(e).__name__, e.code)))
            return False
        seen.add(outcome("acquire", "inserted"))
        return True

    def write(self, _id, me, n):
        return self.coll.update_one({"_id": _id}, {"$set": {"n": n}}).modified_count

    def release(self, _id, me, by_aid=False):
        if by_aid:
            self.locks.delete_many({"aid": me})
        else:
            self.locks.delete_one({"_id": _id})


SCHEMES = {"holderFields": HolderFields, "lockDocument": LockDocument, "flag": Flag, "lockCollection": LockCollection}


def seed(coll, scheme):
    coll.delete_many({})
    if scheme == "lockCollection":
        coll.database[coll.name + ".lock"].delete_many({})
    for _id in HOT:
        d = {"_id": _id, "n": 0}
        if scheme == "flag":
            d["locked"] = False
        elif scheme == "lockDocument":
            d["Lock"] = None
        else:
            d["LockId"] = None
            d["LockTime"] = None
        coll.insert_one(d)


# How long a worker tries to take one lock before it gives up: far longer
# than any holder keeps it, so that reaching it means the lock is never
# coming back (a flag left set by a worker that died with it: the scheme
# leaves its recovery to whoever notices, and these workers do not).
# Giving up ends the worker with an error naming the lock, and the script
# still prints what every worker saw, instead of spinning until
# schemes_test.go kills it with nothing to show.
GIVE_UP_S = max(30.0, 20 * LEASE_S)


class GaveUp(Exception):
    pass


class LeaseLost(Exception):
    """A flag holder's call refused after it may have held the lock for
    its whole lease (work)."""

    def __init__(self, held_ms):
        super().__init__("refused after %d ms held" % held_ms)
        self.held_ms = held_ms


class Abandoned(Exception):
    """The run was abandoned because a worker lost its lease (work)."""


TRIES = [0]


def spin(try_once, what, abandon):
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        TRIES[0] += 1
        if try_once():
            return
        if abandon.is_set():
            raise Abandoned()
        if time.monotonic() > deadline:
            raise GaveUp("gave up taking the lock on %s after %.0f s: its holder never let it go" % (what, GIVE_UP_S))
        time.sleep(0.001)


def work(scheme, uri, direct, db, cname, k, m, rogue):
    # uri may name several proxies, comma-separated: workers alternate
    # between them (one client each).
    uris = uri.split(",")
    clients = [pymongo.MongoClient(u, appname="scheme-worker", retryWrites=False) for u in uris]
    dc = pymongo.MongoClient(direct)
    seed(dc[db][cname], scheme)
    seen = set()
    lock = threading.Lock()
    errors = []
    stop = threading.Event()
    # A flag holder slowed past its lease by a loaded machine loses its
    # lock (docs/SCHEMES.md, flag): its next call is refused, and its flag
    # stays set for good, since the scheme has no expiry and these workers
    # do not recover abandoned flags; its peers spun until GIVE_UP_S (120 s
    # at a 6 s lease) and failed the run. Such a refusal proves nothing
    # either way: the worker reports how long it may have held the lock
    # (leaseLost), every worker stops (abandon), and schemes_test.go runs
    # the workload again under a longer lease. A refusal answered within
    # the lease less lockgate's margin, counted from the send of the
    # acquire that won (before lockgate took the lock), came while the
    # holder's lock lived: it stays a worker error, which fails the test
    # (and stops the workers too).
    lease_lost = []
    abandon = threading.Event()

    def worker(w):
        me = str(uuid.uuid4())
        local = set()
        coll = clients[w % len(clients)][db][cname]
        s = SCHEMES[scheme](coll)
        if scheme == "lockCollection":
            s = LockCollection(coll, upsert=w % 2 == 1)
        try:
            for i in range(m):
                if scheme == "lockDocument":
                    # Two hot documents at once, in key order.
                    ids = [HOT[(w + i) % 2], 3]
                    spin(lambda: s.acquire_all(ids, me, local), "_id %s" % ids, abandon)
                    for _id in ids:
                        n = coll.find_one({"_id": _id})["n"]
                        if s.write(_id, me, n + 1) != 1:
                            local.add("write:not_applied")
                    for _id in reversed(ids):
                        s.release(_id, me)
                    continue
                # Workers 0 and 1 want the same document every round:
                # every run contends, however short.
                _id = HOT[(w // 2 + i) % len(HOT)]
                sent = [0.0]

                def try_acquire():
                    sent[0] = time.monotonic()
                    return s.acquire(_id, me, local)

                spin(try_acquire, "_id %s" % _id, abandon)
                try:
                    n = coll.find_one({"_id": _id})["n"]
                    if s.write(_id, me, n + 1) != 1:
                        local.add("write:not_applied")
                    if scheme == "lockCollection":
                        s.release(_id, me, by_aid=i % 2 == 1)
                    else:
                        s.release(_id, me)
                except OperationFailure:
                    held = time.monotonic() - sent[0]
                    if scheme == "flag" and held >= LEASE_S - MARGIN_S:
                        raise LeaseLost(int(held * 1000))
                    raise
        except LeaseLost as e:
            with lock:
                lease_lost.append(e.held_ms)
            abandon.set()
        except Abandoned:
            pass
        except (PyMongoError, GaveUp) as e:
            local.add("worker_error:%s/%s" % (type(e).__name__, getattr(e, "code", None)))
            with lock:
                errors.append("worker %d: %r" % (w, e))
            # A failed worker may leave its flag set: its peers stop too,
            # rather than spin until GIVE_UP_S.
            abandon.set()
        with lock:
            seen.update(local)

    landed = {"update": 0, "delete": 0}
    rogue_tries = [0]
    refused = set()
    # The age in ms (at the reply) of each lock record the rogue deleted:
    # abandoned ones, and live ones (stolen).
    takeovers, stolen = [], []

    def rogue_loop():
        rc = pymongo.MongoClient(uris[0], appname="scheme-rogue", retryWrites=False)
        rcoll = rc[db][cname]
        rlocks = rc[db][cname + ".lock"]
        i = 0
        while not stop.is_set():
            _id = HOT[i % len(HOT)]
            i += 1
            rogue_tries[0] = i
            try:
                if scheme == "lockCollection" and i % 5 == 1:
                    # Steal a lock: delete someone's record. The scheme
                    # lets anyone delete an abandoned one (ts older than
                    # the lease: what a TTL index deletes), which a worker
                    # slowed past its lease by a loaded machine leaves:
                    # the deleted record comes back, and one whose lease
                    # had not ended by the reply was stolen.
                    rec = rlocks.find_one_and_delete({"_id": _id})
                    if rec is not None:
                        age = now() - rec["ts"]
                        age_ms = int(age.total_seconds() * 1000)
                        if age < datetime.timedelta(seconds=LEASE_S):
                            landed["delete"] += 1
                            stolen.append(age_ms)
                        else:
                            takeovers.append(age_ms)
                elif scheme == "lockCollection" and i % 5 == 2:
                    # Refresh a lock one does not hold.
                    if rlocks.update_one({"_id": _id}, {"$set": {"ts": now()}}).modified_count:
                        landed["update"] += 1
                elif i % 5 == 0:
                    r = rcoll.delete_one({"_id": _id})
                    if r.deleted_count:
                        landed["delete"] += 1
                        rcoll.insert_one(r_doc(scheme, _id))  # keep the workload going
                else:
                    r = rcoll.update_one({"_id": _id}, {"$inc": {"n": 1000}})
                    if r.modified_count:
                        landed["update"] += 1
            except OperationFailure as e:
                refused.add("%s/%s" % (e.code, (e.details or {}).get("codeName")))
            # Paced: each refused write costs lockgate a resolve and a
            # lock store check, and a rogue at 2 ms made up to two thirds
            # of a run's calls through lockgate (docs/TESTING.md, tenth
            # round); a few dozen tries a second still meet every state.
            time.sleep(0.01)
        rc.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(k)]
    rt = threading.Thread(target=rogue_loop) if rogue else None
    if rt:
        rt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if rt:
        rt.join()
    counters = {str(d["_id"]): d.get("n") for d in dc[db][cname].find({}, sort=[("_id", 1)])}
    print(json.dumps({"counters": counters, "rogueLanded": landed, "rogueTakeovers": takeovers, "rogueStolen": stolen, "rogueRefused": sorted(refused),
                      "outcomes": sorted(seen), "errors": errors[:5], "leaseLost": lease_lost,
                      "tries": TRIES[0], "rogueTries": rogue_tries[0]}))
    for c in clients:
        c.close()
    dc.close()


def r_doc(scheme, _id):
    d = {"_id": _id, "n": 0}
    if scheme == "flag":
        d["locked"] = False
    return d


def takeover(scheme, uri, direct, db, cname):
    """A holder takes a lock and vanishes; another takes it over as the
    scheme says."""
    out = {}
    a = pymongo.MongoClient(uri, appname="scheme-crashed", retryWrites=False)
    b = pymongo.MongoClient(uri, appname="scheme-successor", retryWrites=False)
    ca, cb = a[db][cname], b[db][cname]
    dc = pymongo.MongoClient(direct)
    seed(dc[db][cname], scheme)
    seen = set()
    # Both connected before A takes its lock: the lock's time is taken
    # before the write is sent, so a first connection made on the way
    # would count into A's lease.
    a.admin.command("ping")
    b.admin.command("ping")
    start = time.monotonic()

    def early_done():
        # How long A's lock had lived, at most, when B's early steps were
        # answered: if not less than A's lease, A's lock may have ended
        # before them, and their outcome says nothing (schemes_test.go
        # runs the takeover again).
        out["early_ms"] = int((time.monotonic() - start) * 1000)

    if scheme == "holderFields":
        out["a_acquire"] = HolderFields(ca).acquire(1, "A", seen)
        out["b_acquire_early"] = HolderFields(cb).acquire(1, "B", seen)
        early_done()
        time.sleep(LEASE_S + 0.5)
        # Expired, not taken over: the holder's write still lands, as on
        # the database; a takeover then waits out lockgate's margin.
        out["a_write_after_lease"] = HolderFields(ca).write(1, "A", 5)
        time.sleep(0.4)
        out["b_acquire_after_lease"] = HolderFields(cb).acquire(1, "B", seen)
        out["a_write_after_takeover"] = HolderFields(ca).write(1, "A", 99)
        out["b_write"] = HolderFields(cb).write(1, "B", 7)
    elif scheme == "lockDocument":
        out["a_acquire"] = LockDocument(ca).acquire(1, "A", seen, lease=LEASE_S * 2 / 3)
        out["b_acquire_early"] = LockDocument(cb).acquire(1, "B", seen)
        early_done()
        time.sleep(LEASE_S)
        out["a_write_after_expiry"] = LockDocument(ca).write(1, "A", 5)
        time.sleep(0.4)
        out["b_acquire_after_expiry"] = LockDocument(cb).acquire(1, "B", seen)
        out["a_write_after_takeover"] = LockDocument(ca).write(1, "A", 99)
        out["b_write"] = LockDocument(cb).write(1, "B", 7)
        LockDocument(cb).release(1, "B", error="failed halfway")
        out["after_error_release"] = cb.find_one({"_id": 1})["Lock"]
        out["c_acquire_after_error_release"] = LockDocument(ca).acquire(1, "C", seen)
    elif scheme == "lockCollection":
        la, lb = LockCollection(ca), LockCollection(cb)
        out["a_acquire"] = la.acquire(1, "A", seen)
        out["b_acquire_early"] = lb.acquire(1, "B", seen)
        out["b_acquire_upsert_early"] = LockCollection(cb, upsert=True).acquire(1, "B", seen)
        try:
            out["b_delete_early"] = lb.locks.delete_one({"_id": 1}).deleted_count
        except OperationFailure as e:
            out["b_delete_early"] = "refused/%s" % e.code
        try:
            out["b_refresh_early"] = lb.locks.update_one({"_id": 1}, {"$set": {"ts": now()}}).modified_count
        except OperationFailure as e:
            out["b_refresh_early"] = "refused/%s" % e.code
        early_done()
        time.sleep(LEASE_S + 0.5)
        # What a TTL index on ts does on MongoDB (FerretDB has none):
        # the expired record goes.
        dc[db][cname + ".lock"].delete_one({"_id": 1, "ts": {"$lt": now() - datetime.timedelta(seconds=LEASE_S)}})
        out["b_acquire_after_ttl"] = lb.acquire(1, "B", seen)
        try:
            out["a_write_after_takeover"] = la.write(1, "A", 99)
        except OperationFailure as e:
            out["a_write_after_takeover"] = "refused/%s" % e.code
        out["b_write"] = lb.write(1, "B", 7)
        out["b_release_all"] = lb.locks.delete_many({"aid": "B"}).deleted_count
        out["a_acquire_after_release"] = la.acquire(1, "A", seen)
    else:
        out["a_acquire"] = Flag(ca).acquire(1, "A", seen)
        out["b_acquire_early"] = Flag(cb).acquire(1, "B", seen)
        try:
            out["b_clear_early"] = cb.update_one({"_id": 1}, {"$set": {"locked": False}}).modified_count
        except OperationFailure as e:
            out["b_clear_early"] = "refused/%s" % e.code
        early_done()
        # The flag has no expiry of its own: once the holder has been
        # silent for the lease, its lock is abandoned and may be cleared.
        time.sleep(LEASE_S + 0.5)
        out["b_clear_after_lease"] = cb.update_one({"_id": 1}, {"$set": {"locked": False}}).modified_count
        out["b_acquire_after_clear"] = Flag(cb).acquire(1, "B", seen)
        try:
            out["a_write_after_takeover"] = Flag(ca).write(1, "A", 99)
        except OperationFailure as e:
            out["a_write_after_takeover"] = "refused/%s" % e.code
        out["b_write"] = Flag(cb).write(1, "B", 7)
    out["final"] = cb.find_one({"_id": 1}).get("n")
    print(json.dumps(out, default=str))
    a.close()
    b.close()


def main():
    scheme, mode, uri, direct, db, cname = sys.argv[1:7]
    if mode == "work":
        k, m, rogue = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
        work(scheme, uri, direct, db, cname, k, m, rogue)
    else:
        takeover(scheme, uri, direct, db, cname)


if __name__ == "__main__":
    main()
