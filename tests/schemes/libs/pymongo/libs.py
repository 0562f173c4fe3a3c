#!/usr/bin/python3
"""Five common MongoDB locking libraries, each translated call for call
(their filters, updates, options and return-value handling) into pymongo.

Usage: /usr/bin/python3 libs.py <lib> <mode> <uri[,uri2]> <direct-uri> <db> <base> [K M rogue]

Document ids are <base>+1, <base>+2, ...: each client gets its own, so that
locks one run leaves to expire never meet the next run.

lib: mongolocks | drmirror | alistair | tharga | codecentric
mode:
  work      K worker threads (alternating between the proxies of <uri>)
            each do M read-then-increment rounds on hot documents under
            the library's lock, while, if rogue is 1, a rogue client loops
            writes that ignore the lock. Prints one JSON object: final
            counters, the rogue's landed writes and refusals, the distinct
            shapes of return values the library calls saw ("outcomes"),
            the library's own setup calls' results, and errors.
  setup     the library's own setup calls (index creation): what each
            answered.
  takeover  a holder takes a lock and vanishes; others go on as the
            library expects. Prints what each step returned.

Seeding and the final read go through <direct-uri>. The script judges
nothing; libs_test.go does. Each class names the repository and file it
translates; the library's code is not copied, its calls are rewritten in
pymongo with the same arguments. Values a library hard-codes (timeouts)
are scaled down to the tests' lease where the test must wait them out.
"""

import datetime
import json
import os
import sys
import threading
import time
import uuid
import warnings

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

# drmirror's count() is deprecated in pymongo, and kept: it is the call the
# library makes.
warnings.simplefilter("ignore", DeprecationWarning)

HOT = [1, 2, 3]
BASE = 0
# The tests' lease: holderFields' and flag's leaseMS, the lock collections'
# TTL, Tharga's timeout and alistair's ExpireAt, in seconds. libs_test.go
# sets it (scaled with the machine's load) for the rules and the scripts
# alike.
LEASE_S = int(os.environ["LOCKGATE_TEST_LEASE_MS"]) / 1000
# The pause of a worker whose lock was busy before it tries again: the
# harness's pacing, not the library's. At 1 ms a waiting worker asked
# again as fast as lockgate and FerretDB answered, and most of the
# workload's CPU (the scripts', lockgate's, FerretDB's) went to asking
# (docs/TESTING.md, the twelfth box). 20 ms is short against the 3 s
# lease and still finds the lock busy: two workers want the same
# document in every round.
RETRY_S = 0.02
# The lease a lockgate lock must have left for a write to pass
# (policy.leaseMarginMS of the gateways, twoproxies.LeaseMarginMS).
MARGIN = datetime.timedelta(milliseconds=int(os.environ["LOCKGATE_TEST_LEASE_MARGIN_MS"]))


def new_rollback():
    """What LockManyAsync's rollbacks met (Tharga.lock_many): the writes
    it made, and those that failed, by error: "refused" (the server's
    answer, by codeName) and "failed" (any other error) while the lock
    had more than lockgate's margin left, "expired" once it might not
    have (a lock lost to a loaded machine, not judged)."""
    return {"writes": 0, "refused": {}, "failed": {}, "expired": {}}


def merge_rollback(into, r):
    into["writes"] += r["writes"]
    for k in ("refused", "failed", "expired"):
        for name, n in r[k].items():
            into[k][name] = into[k].get(name, 0) + n


def utcnow():
    # Millisecond precision, as BSON dates store it (and as .NET's
    # DateTime.UtcNow ends up once serialized).
    t = datetime.datetime.utcnow()
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def err(e):
    return "%s/%s" % (type(e).__name__, getattr(e, "code", None))


def refused_or(f):
    """A step's result, or "refused/<code>" when the server (or lockgate)
    answers with an error."""
    try:
        return f()
    except OperationFailure as e:
        return "refused/%s" % e.code


class LockException(Exception):
    """A library's own "not acquired"/"not released" exception."""


# --- MongoLocks ------------------------------------------------------------


class MongoLocks:
    """mizrael/MongoLocks, MongoLocks/DummyRepository.cs (LockAsync,
    ReleaseLock): LockId (a standard Guid) + LockTime on the document.

    LockAsync: FindOneAndUpdate(And(Eq(Id, id), Or(Eq(LockId, null),
    Lt(LockTime, UtcNow - lockMaxDuration))), Set(LockId, NewGuid).Set(LockTime,
    UtcNow) [.SetOnInsert(Id, ...).SetOnInsert(Value, ...) for a new entity],
    {IsUpsert, ReturnDocument.After}); DuplicateKey (11000) -> LockException.
    ReleaseLock: UpdateOne(And(Eq(Id, item.Id), Eq(LockId, item.LockId)),
    Set(Value, item.Value).Set(LockId, null).Set(LockTime, null), {IsUpsert:
    false}); ModifiedCount != 1 -> LockException. The write of the data is
    the release itself.
    """

    COLL = "dummies"
    FIELD = "Value"

    def __init__(self, db, lock_max_duration=LEASE_S):
        self.coll = db[self.COLL]
        self.max = datetime.timedelta(seconds=lock_max_duration)

    def lock(self, _id, new_entity=None, seen=None):
        flt = {"_id": _id, "$or": [{"LockId": None}, {"LockTime": {"$lt": utcnow() - self.max}}]}
        upd = {"$set": {"LockId": uuid.uuid4(), "LockTime": utcnow()}}
        if new_entity is not None:
            upd["$setOnInsert"] = {"_id": new_entity["_id"], "Value": new_entity["Value"]}
        try:
            doc = self.coll.find_one_and_update(flt, upd, upsert=True, return_document=ReturnDocument.AFTER)
        except OperationFailure as e:
            # The original catches MongoCommandException with Code 11000
            # and CodeName "DuplicateKey" only.
            if e.code != 11000 or (e.details or {}).get("codeName") != "DuplicateKey":
                raise
            if seen is not None:
                seen.add("lock:" + err(e))
            raise LockException("item '%s' is already locked" % _id)
        if seen is not None:
            seen.add("lock:%s" % shape(doc))
        return doc

    def release(self, item, seen=None):
        r = self.coll.update_one({"_id": item["_id"], "LockId": item["LockId"]},
                                 {"$set": {"Value": item["Value"], "LockId": None, "LockTime": None}}, upsert=False)
        if seen is not None:
            seen.add("release:matched=%d,modified=%d" % (r.matched_count, r.modified_count))
        if r.modified_count != 1:
            raise LockException("unable to release lock on item '%s'" % item["_id"])

    # The workload: the repository's tests lock, change Value, release.
    def round(self, w, i, seen, ctx):
        _id = HOT[(w // 2 + i) % len(HOT)]
        while True:
            try:
                item = self.lock(_id, seen=seen)
                break
            except LockException:
                time.sleep(RETRY_S)
        item["Value"] += 1
        self.release(item, seen)

    @staticmethod
    def seed_doc(_id):
        return {"_id": _id, "Value": 0, "LockId": None, "LockTime": None}


def shape(doc):
    """The shape of a returned document: null, or its sorted top-level keys
    (values differ between runs, keys must not)."""
    if doc is None:
        return "null"
    return "doc(%s)" % ",".join(sorted(doc.keys()))


# --- drmirror/locks --------------------------------------------------------


class DrMirror:
    """drmirror/locks, lock.py (init, lock, unlock): a boolean "locked" per
    document, every call in one explicit session.

    init: count({_id: x}) == 0 -> insert_one({_id: x, locked: False}),
    ignoring a duplicate. lock: loop update_one({_id: x, locked: False},
    {$set: {locked: True}}, session) until modified_count == 1, waiting in
    between on a change stream (watch([$match documentKey._id x and
    updateDescription.updatedFields.locked False], start_at_operation_time =
    session.operation_time, session)). unlock: update_one({_id: x}, {$set:
    {locked: False}}, session). Where change streams are missing (FerretDB
    answers NotImplemented) the wait polls instead: the one change to the
    original, as an application on such a server would have to make.
    """

    COLL = "locks"
    FIELD = "n"

    def __init__(self, db, session=None):
        self.coll = db[self.COLL]
        self.session = session

    def init(self, x):
        if self.coll.count({"_id": x}) == 0:
            try:
                self.coll.insert_one({"_id": x, "locked": False})
            except PyMongoError:
                pass  # somebody else inserted it first: fine, as in the original

    def try_lock(self, x, seen=None):
        r = self.coll.update_one({"_id": x, "locked": False}, {"$set": {"locked": True}}, session=self.session)
        if seen is not None:
            seen.add("lock:matched=%d,modified=%d" % (r.matched_count, r.modified_count))
        return r.modified_count == 1

    def lock(self, x, seen=None):
        while not self.try_lock(x, seen):
            try:
                cursor = self.coll.watch(
                    [{"$match": {"documentKey._id": x, "updateDescription.updatedFields.locked": False}}],
                    start_at_operation_time=self.session.operation_time, session=self.session)
                cursor.next()
                cursor.close()
            except OperationFailure as e:
                if seen is not None:
                    seen.add("watch:" + err(e))
                time.sleep(RETRY_S)

    def unlock(self, x, seen=None):
        r = self.coll.update_one({"_id": x}, {"$set": {"locked": False}}, session=self.session)
        if seen is not None:
            seen.add("unlock:matched=%d,modified=%d" % (r.matched_count, r.modified_count))
        return r.modified_count

    def write(self, x, n):
        return self.coll.update_one({"_id": x}, {"$set": {"n": n}}, session=self.session).modified_count

    def round(self, w, i, seen, ctx):
        x = HOT[(w // 2 + i) % len(HOT)]
        self.lock(x, seen)
        n = self.coll.find_one({"_id": x}, session=self.session)["n"]
        if self.write(x, n + 1) != 1:
            seen.add("write:not_applied")
        self.unlock(x, seen)

    @staticmethod
    def seed_doc(_id):
        return {"_id": _id, "locked": False, "n": 0}


# --- alistairjevans/mongodb-locks ------------------------------------------


class Alistair:
    """alistairjevans/mongodb-locks, LockProvider.cs (constructor,
    AcquireLock) and DistributedLock.cs (AttemptGetLock, Dispose): records
    {_id: "lock_<resourceId>", ExpireAt} in one "resourceLocks" collection
    with a TTL index on ExpireAt (ExpireAfter = TimeSpan.Zero).

    AttemptGetLock: FindOneAndUpdate(Id == lockId, SetOnInsert(Id,
    lockId).SetOnInsert(ExpireAt, UtcNow + 1 min), {IsUpsert, ReturnDocument
    .Before}); null -> acquired; a document -> held by someone else;
    DuplicateKey (11000) -> not acquired. AcquireLock retries every 100 ms
    for 10 s, then throws. Dispose: DeleteOne(Id == lockId) if acquired. The
    resource here is a document {_id: <resourceId>, n} of a data collection,
    written while the lock is held. ExpireAt is UtcNow + expire (the
    original's minute, LEASE_S when a test waits it out).
    """

    COLL = "resources"
    FIELD = "n"
    LOCKS = "resourceLocks"

    def __init__(self, db, expire_s=60.0):
        self.db = db
        self.coll = db[self.COLL]
        self.locks = db[self.LOCKS]
        self.expire = datetime.timedelta(seconds=expire_s)

    def setup(self):
        # LockProvider's constructor: the TTL index.
        self.locks.create_index([("ExpireAt", pymongo.ASCENDING)], expireAfterSeconds=0)

    def attempt(self, resource_id, seen=None):
        lock_id = "lock_%s" % resource_id
        try:
            resp = self.locks.find_one_and_update(
                {"_id": lock_id},
                {"$setOnInsert": {"_id": lock_id, "ExpireAt": utcnow() + self.expire}},
                upsert=True, return_document=ReturnDocument.BEFORE)
        except OperationFailure as e:
            if e.code == 11000:
                if seen is not None:
                    seen.add("attempt:" + err(e))
                return False
            raise
        if seen is not None:
            seen.add("attempt:%s" % shape(resp))
        return resp is None

    def acquire(self, resource_id, seen=None):
        start = time.monotonic()
        while not self.attempt(resource_id, seen):
            time.sleep(0.1)
            if time.monotonic() - start > 10:
                raise LockException("Could not acquire lock for %s within the timeout." % resource_id)

    def dispose(self, resource_id, seen=None):
        r = self.locks.delete_one({"_id": "lock_%s" % resource_id})
        if seen is not None:
            seen.add("dispose:deleted=%d" % r.deleted_count)
        return r.deleted_count

    def write(self, resource_id, n):
        return self.coll.update_one({"_id": resource_id}, {"$set": {"n": n}}).modified_count

    def round(self, w, i, seen, ctx):
        r = "r%d" % HOT[(w // 2 + i) % len(HOT)]
        self.acquire(r, seen)
        n = self.coll.find_one({"_id": r})["n"]
        if self.write(r, n + 1) != 1:
            seen.add("write:not_applied")
        self.dispose(r, seen)

    @staticmethod
    def seed_doc(_id):
        return {"_id": "r%d" % _id, "n": 0}


# --- Tharga.MongoDB ---------------------------------------------------------


class LockExpiredException(Exception):
    pass


class LockErrorException(Exception):
    pass


class UnknownException(Exception):
    pass


class InvalidOperation(Exception):
    pass


class Tharga:
    """Tharga/MongoDB, Tharga.MongoDB/Lockable/LockableRepositoryCollectionBase.cs
    (AcquireLockAsync, CreateLockAsync, ReleaseAsync,
    PrepareCommitForUpdateAsync, LockManyAsync, ReleaseOneAsync),
    EntityScope.cs (CommitAsync, AbandonAsync, SetErrorStateAsync),
    DocumentLease.cs (CommitAsync) and Disk/DiskRepositoryCollectionBase.cs
    (UpdateOneAsync, ReplaceOneWithCheckAsync): a "Lock" sub-document
    {LockKey (Guid), LockTime, ExpireTime, Actor, ExceptionInfo}, absent
    when unlocked ([BsonIgnoreIfNull]).

    acquire: FindOneAndUpdate(Or(And(filter, Eq(Lock, null)), And(filter,
      Ne(Lock, null), Eq(Lock.ExceptionInfo, null), Lt(Lock.ExpireTime,
      now))), Set(Lock, {LockKey, LockTime, ExpireTime, Actor}),
      {ReturnDocument.Before, IsUpsert: false}); null -> (failIfLocked)
      Find(filter): none -> null, one without ExceptionInfo -> LockException,
      with -> LockErrorException, several -> UnknownException. A returned
      document whose Lock has not expired -> NotSupportedException (a double
      grant).
    commit: client-side expiry check (LockExpiredException), then
      FindOneAndReplace(And(Eq(Id), Ne(Lock, null), Eq(Lock.LockKey, key)),
      entity without Lock) (ReturnDocument.Before); null -> "Cannot find
      entity before release".
    abandon / error state: client-side expiry check for the error state
      only, then Find({_id}).Limit(2) and FindOneAndUpdate({_id}, Set(Lock,
      null | lock with ExceptionInfo)); then Find({_id}) for the after.
    ReleaseOneAsync(id, ExceptionOnly): FindOneAndUpdate(And(Eq(Id),
      Ne(Lock, null), Ne(Lock.ExceptionInfo, null)), Set(Lock, null),
      ReturnDocument.Before).
    LockManyAsync: distinct ids in order, acquire each (failIfLocked), on
      failure abandon the taken ones and rethrow; the lease commits each.
    """

    COLL = "entities"
    FIELD = "Counter"

    def __init__(self, db, timeout_s=30.0, actor="worker"):
        self.coll = db[self.COLL]
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.actor = actor
        self.rollback = new_rollback()

    def _acquire(self, flt, fail_if_locked, seen=None):
        now = utcnow()
        key = uuid.uuid4()
        unlocked = dict(flt, Lock=None)
        expired = dict(flt, **{"Lock": {"$ne": None}, "Lock.ExceptionInfo": None, "Lock.ExpireTime": {"$lt": now}})
        lock = {"LockKey": key, "LockTime": now, "ExpireTime": now + self.timeout, "Actor": self.actor}
        before = self.coll.find_one_and_update({"$or": [unlocked, expired]}, {"$set": {"Lock": lock}},
                                               return_document=ReturnDocument.BEFORE, upsert=False)
        if seen is not None:
            seen.add("acquire:%s" % shape(before))
        if before is None:
            if not fail_if_locked:
                return None, None
            docs = list(self.coll.find(flt))
            if not docs:
                return None, None
            if len(docs) == 1:
                d = docs[0]
                if (d.get("Lock") or {}).get("ExceptionInfo") is None:
                    raise LockException("Entity with id '%s' is locked." % d["_id"])
                raise LockErrorException("Entity with id '%s' has an exception attached." % d["_id"])
            raise UnknownException("Matched with %d documents but no unlocked" % len(docs))
        if before.get("Lock") is not None and now <= before["Lock"]["ExpireTime"]:
            raise InvalidOperation("NotSupportedException: the entity that was picked had a lock that has not yet expired")
        return before, lock

    def pick(self, _id, seen=None):
        """PickForUpdateAsync(id): the entity (as it was before the lock) and
        its lock, LockException when locked, None when missing."""
        return self._acquire({"_id": _id}, True, seen)

    def pick_filter(self, flt, seen=None):
        """PickForUpdateAsync(filter): one unlocked document of several."""
        return self._acquire(flt, False, seen)

    def _expired(self, lock):
        return utcnow() - lock["LockTime"] > lock["ExpireTime"] - lock["LockTime"]

    def commit(self, entity, lock, seen=None):
        if self._expired(lock):
            raise LockExpiredException("Too late to release entity locked by %s." % lock["Actor"])
        replacement = {k: v for k, v in entity.items() if k != "Lock"}
        before = self.coll.find_one_and_replace(
            {"_id": entity["_id"], "Lock": {"$ne": None}, "Lock.LockKey": lock["LockKey"]}, replacement)
        if seen is not None:
            seen.add("commit:%s" % shape(before))
        if before is None:
            raise InvalidOperation("Cannot find entity before release.")
        if before.get("Lock") is None:
            raise InvalidOperation("No lock information for document before release.")
        return True

    def _release_without_commit(self, entity, lock_info, seen, step):
        item = list(self.coll.find({"_id": entity["_id"]}).limit(2))
        if len(item) > 1:
            raise InvalidOperation("SingleOrDefault: more than one")
        if not item:
            raise InvalidOperation("Cannot find entity before release.")
        before = self.coll.find_one_and_update({"_id": item[0]["_id"]}, {"$set": {"Lock": lock_info}})
        if seen is not None:
            seen.add("%s:%s" % (step, shape(before)))
        if before is None:
            raise InvalidOperation("Cannot find entity before release.")
        if before.get("Lock") is None:
            raise InvalidOperation("No lock information for document before release.")
        after = self.coll.find_one({"_id": item[0]["_id"]})
        return after is not None and after.get("Lock") is None

    def abandon(self, entity, lock, seen=None):
        return self._release_without_commit(entity, None, seen, "abandon")

    def set_error_state(self, entity, lock, message, seen=None):
        if self._expired(lock):
            raise LockExpiredException("Too late to release entity locked by %s." % lock["Actor"])
        info = dict(lock, ExceptionInfo={"Type": "Exception", "Message": message, "StackTrace": None})
        return self._release_without_commit(entity, info, seen, "error")

    def release_one_exception_only(self, _id, seen=None):
        before = self.coll.find_one_and_update(
            {"_id": _id, "Lock": {"$ne": None}, "Lock.ExceptionInfo": {"$ne": None}}, {"$set": {"Lock": None}},
            return_document=ReturnDocument.BEFORE, upsert=False)
        if seen is not None:
            seen.add("releaseOne:%s" % shape(before))
        return before

    def lock_many(self, ids, seen=None):
        entries = []
        try:
            for _id in sorted(set(ids)):
                entity, lock = self.pick(_id, seen)
                if entity is None:
                    raise InvalidOperation("No document with id '%s' was found." % _id)
                entries.append((entity, lock))
            return entries
        except Exception:
            # The library's best-effort rollback swallows its errors; the
            # harness counts them (self.rollback), so that a refused
            # rollback, which leaves a lock held until it expires, is seen.
            for entity, lock in entries:
                self.rollback["writes"] += 1
                try:
                    self.abandon(entity, lock, seen)
                except Exception as e:
                    if utcnow() + MARGIN >= lock["ExpireTime"]:
                        kind, name = "expired", type(e).__name__
                    elif isinstance(e, OperationFailure):
                        kind, name = "refused", (e.details or {}).get("codeName") or str(e.code)
                    else:
                        kind, name = "failed", type(e).__name__
                    self.rollback[kind][name] = self.rollback[kind].get(name, 0) + 1
            raise

    def wait_pick(self, _id, seen):
        # WaitForUpdateAsync: re-pick while the answer is "locked".
        while True:
            try:
                return self.pick(_id, seen)
            except LockException:
                time.sleep(RETRY_S)

    def round(self, w, i, seen, ctx):
        if i % 2 == 0:
            _id = HOT[(w // 2 + i) % len(HOT)]
            entity, lock = self.wait_pick(_id, seen)
            if i % 4 == 0:
                # Picked, then given up: the abandon, then the real work.
                self.abandon(entity, lock, seen)
                entity, lock = self.wait_pick(_id, seen)
            n = self.coll.find_one({"_id": _id})["Counter"]
            self.commit(dict(entity, Counter=n + 1), lock, seen)
            return
        ids = [HOT[(w // 2 + i) % len(HOT)], HOT[(w // 2 + i + 1) % len(HOT)]]
        while True:
            try:
                entries = self.lock_many(ids, seen)
                break
            except LockException:
                seen.add("lockMany:LockException")
                time.sleep(RETRY_S)
        for entity, lock in entries:
            n = self.coll.find_one({"_id": entity["_id"]})["Counter"]
            self.commit(dict(entity, Counter=n + 1), lock, seen)

    @staticmethod
    def seed_doc(_id):
        return {"_id": _id, "Counter": 0}


# --- codecentric ------------------------------------------------------------


class Codecentric:
    """codecentric's "Pessimistic Locking with MongoDB" (blog.codecentric.de,
    2012/10/mongodb-pessimistic-locking): a lock collection "workitem.lock"
    of {_id: <workitem _id>, ts, aid}, a TTL index {ts: 1}
    (expireAfterSeconds 30, LEASE_S here) and an index on aid.

    obtain: read the document, insert {_id: doc._id, ts: now, aid: app_id};
    DuplicateKey -> locked by someone else. release: remove({_id: doc._id}),
    or every lock of the application: remove({aid: app_id}). Abandoned
    locks go with the TTL.
    """

    COLL = "workitem"
    FIELD = "n"

    def __init__(self, db, aid="app"):
        self.coll = db[self.COLL]
        self.locks = db[self.COLL + ".lock"]
        self.aid = aid

    def setup(self):
        self.locks.create_index([("ts", pymongo.ASCENDING)], expireAfterSeconds=int(LEASE_S) or 1)
        self.locks.create_index([("aid", pymongo.ASCENDING)], unique=False)

    def obtain(self, _id, seen=None):
        doc = self.coll.find_one({"_id": _id})
        try:
            self.locks.insert_one({"_id": doc["_id"], "ts": utcnow(), "aid": self.aid})
        except DuplicateKeyError as e:
            if seen is not None:
                seen.add("obtain:" + err(e))
            return False
        if seen is not None:
            seen.add("obtain:inserted")
        return True

    def release(self, _id, seen=None):
        r = self.locks.delete_one({"_id": _id})
        if seen is not None:
            seen.add("release:deleted=%d" % r.deleted_count)
        return r.deleted_count

    def release_all(self, seen=None):
        r = self.locks.delete_many({"aid": self.aid})
        if seen is not None:
            seen.add("releaseAll:deleted=%d" % r.deleted_count)
        return r.deleted_count

    def write(self, _id, n):
        return self.coll.update_one({"_id": _id}, {"$set": {"n": n}}).modified_count

    def round(self, w, i, seen, ctx):
        _id = HOT[(w // 2 + i) % len(HOT)]
        while not self.obtain(_id, seen):
            time.sleep(RETRY_S)
        n = self.coll.find_one({"_id": _id})["n"]
        if self.write(_id, n + 1) != 1:
            seen.add("write:not_applied")
        if i % 2 == 0:
            self.release(_id, seen)
        else:
            self.release_all(seen)

    @staticmethod
    def seed_doc(_id):
        return {"_id": _id, "n": 0}


LIBS = {"mongolocks": MongoLocks, "drmirror": DrMirror, "alistair": Alistair, "tharga": Tharga,
        "codecentric": Codecentric}


def client(uri, app):
    # Standard Guids, as the C# libraries store them.
    return pymongo.MongoClient(uri, appname=app, retryWrites=False, uuidRepresentation="standard")


def seed(ddb, lib):
    cls = LIBS[lib]
    ddb[cls.COLL].delete_many({})
    if lib == "alistair":
        ddb[Alistair.LOCKS].delete_many({})
    if lib == "codecentric":
        ddb[Codecentric.COLL + ".lock"].delete_many({})
    for _id in HOT:
        ddb[cls.COLL].insert_one(cls.seed_doc(_id))


def setup_calls(lib, db):
    """The library's own setup (index creation), through the client under
    test: what each call answered."""
    out = {}
    if lib == "alistair":
        out["createIndex"] = refused_or(lambda: Alistair(db).setup() or "ok")
    elif lib == "codecentric":
        out["createIndex"] = refused_or(lambda: Codecentric(db).setup() or "ok")
    return out


def make(lib, db, w, session):
    if lib == "drmirror":
        return DrMirror(db, session)
    if lib == "tharga":
        # The lease the other libraries' workers take, not the library's
        # default of 30 s: now and then a lock is left behind (straight
        # at the database too, so by the library's flow on FerretDB; the
        # cause is not found) and every worker wanting it waited 30 s
        # (docs/TESTING.md, tenth round).
        return Tharga(db, timeout_s=LEASE_S, actor="w%d" % w)
    if lib == "codecentric":
        return Codecentric(db, aid="w%d-%s" % (w, uuid.uuid4()))
    return LIBS[lib](db)


def work(lib, uri, direct, dbname, k, m, rogue):
    uris = uri.split(",")
    clients = [client(u, "lib-worker") for u in uris]
    dc = client(direct, "lib-seed")
    seed(dc[dbname], lib)
    setup = setup_calls(lib, clients[0][dbname])
    cls = LIBS[lib]
    seen = set()
    mu = threading.Lock()
    errors = []
    stop = threading.Event()
    rollback = new_rollback()

    def worker(w):
        local = set()
        c = clients[w % len(clients)]
        session = c.start_session() if lib == "drmirror" else None
        s = make(lib, c[dbname], w, session)
        try:
            if lib == "drmirror":
                for x in HOT:
                    s.init(x)
            for i in range(m):
                s.round(w, i, local, None)
        except Exception as e:  # a library exception is a failed worker
            local.add("worker_error:" + err(e))
            with mu:
                errors.append(repr(e))
        if session is not None:
            session.end_session()
        with mu:
            seen.update(local)
            if isinstance(s, Tharga):
                merge_rollback(rollback, s.rollback)

    landed = {"update": 0, "delete": 0}
    refused = set()

    def rogue_loop():
        rc = client(uris[0], "lib-rogue")
        rdb = rc[dbname]
        rcoll = rdb[cls.COLL]
        rlocks = None
        if lib == "alistair":
            rlocks = rdb[Alistair.LOCKS]
        elif lib == "codecentric":
            rlocks = rdb[Codecentric.COLL + ".lock"]
        i = 0
        while not stop.is_set():
            _id = cls.seed_doc(HOT[i % len(HOT)])["_id"]
            rid = "lock_%s" % _id if lib == "alistair" else _id
            i += 1
            try:
                if rlocks is not None and i % 5 == 1:
                    # Steal a lock: delete someone's record.
                    if rlocks.delete_one({"_id": rid}).deleted_count:
                        landed["delete"] += 1
                elif rlocks is not None and i % 5 == 2:
                    # Prolong a lock one does not hold.
                    f = "ExpireAt" if lib == "alistair" else "ts"
                    if rlocks.update_one({"_id": rid}, {"$set": {f: utcnow()}}).modified_count:
                        landed["update"] += 1
                elif i % 5 == 0:
                    r = rcoll.delete_one({"_id": _id})
                    if r.deleted_count:
                        landed["delete"] += 1
                        rcoll.insert_one(cls.seed_doc(HOT[(i - 1) % len(HOT)]))  # keep the workload going
                else:
                    r = rcoll.update_one({"_id": _id}, {"$inc": {cls.FIELD: 1000}})
                    if r.modified_count:
                        landed["update"] += 1
            except OperationFailure as e:
                refused.add("%s/%s" % (e.code, (e.details or {}).get("codeName")))
            # Paced as ../../pymongo/schemes.py's rogue is (docs/TESTING.md,
            # tenth round): its refused writes were most of a run's calls.
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
    counters = {str(d["_id"]): d.get(cls.FIELD) for d in dc[dbname][cls.COLL].find({}, sort=[("_id", 1)])}
    print(json.dumps({"counters": counters, "rogueLanded": landed, "rogueRefused": sorted(refused),
                      "outcomes": sorted(seen), "setup": setup, "errors": errors[:5], "rollback": rollback}))
    for c in clients:
        c.close()
    dc.close()


def outcome_of(f):
    """A step's result as the library reports it: its value, the name of
    the library exception it raised, or "refused/<code>"."""
    try:
        return f()
    except OperationFailure as e:
        return "refused/%s" % e.code
    except Exception as e:  # the library's exceptions, by name
        return type(e).__name__


def takeover(lib, uri, direct, dbname):
    out = {}

    def I(n):
        return BASE + n

    R = "r%d" % I(1)
    a = client(uri, "lib-crashed")
    b = client(uri, "lib-successor")
    dc = client(direct, "lib-seed")
    seed(dc[dbname], lib)
    da, db_ = a[dbname], b[dbname]
    if lib == "mongolocks":
        la, lb = MongoLocks(da), MongoLocks(db_)
        held = {}

        def lock(l, who, _id, new=None):
            doc = l.lock(_id, new)
            held[who] = doc
            return "locked" if doc is not None and doc.get("LockId") is not None else shape(doc)

        def release(l, who, value):
            item = dict(held[who], Value=value)
            l.release(item)
            return "released"

        out["a_lock"] = outcome_of(lambda: lock(la, "a", I(1)))
        out["b_lock_early"] = outcome_of(lambda: lock(lb, "b", I(1)))
        time.sleep(LEASE_S + 0.6)
        out["b_lock_after_lease"] = outcome_of(lambda: lock(lb, "b", I(1)))
        out["a_release_after_takeover"] = outcome_of(lambda: release(la, "a", 99))
        out["b_release"] = outcome_of(lambda: release(lb, "b", 7))
        # LockAsync with a new entity: the upsert creates it locked.
        out["c_lock_new"] = outcome_of(lambda: lock(la, "c", I(42), {"_id": I(42), "Value": 5}))
        out["c_release_new"] = outcome_of(lambda: release(la, "c", 6))
        out["new_value"] = dc[dbname][MongoLocks.COLL].find_one({"_id": I(42)})["Value"]
        out["final"] = dc[dbname][MongoLocks.COLL].find_one({"_id": I(1)})["Value"]
    elif lib == "drmirror":
        sa, sb = a.start_session(), b.start_session()
        la, lb = DrMirror(da, sa), DrMirror(db_, sb)
        la.init(I(1))
        lb.init(I(1))
        out["a_lock"] = outcome_of(lambda: la.try_lock(I(1)))
        out["b_lock_early"] = outcome_of(lambda: lb.try_lock(I(1)))
        out["b_unlock_early"] = outcome_of(lambda: lb.unlock(I(1)))
        # The holder vanished; after the lease the flag is cleared by hand,
        # with the library's own unlock.
        time.sleep(LEASE_S + 0.5)
        out["b_unlock_after_lease"] = outcome_of(lambda: lb.unlock(I(1)))
        out["b_lock"] = outcome_of(lambda: lb.try_lock(I(1)))
        out["a_write_after_takeover"] = outcome_of(lambda: la.write(I(1), 99))
        out["a_unlock_after_takeover"] = outcome_of(lambda: la.unlock(I(1)))
        out["b_write"] = outcome_of(lambda: lb.write(I(1), 7))
        out["b_unlock"] = outcome_of(lambda: lb.unlock(I(1)))
        out["final"] = dc[dbname][DrMirror.COLL].find_one({"_id": I(1)})["n"]
        sa.end_session()
        sb.end_session()
    elif lib == "alistair":
        la, lb = Alistair(da, expire_s=LEASE_S), Alistair(db_, expire_s=LEASE_S)
        out["a_acquire"] = outcome_of(lambda: la.attempt(R))
        out["b_acquire_early"] = outcome_of(lambda: lb.attempt(R))
        # ExpireAt passes: on MongoDB the TTL monitor removes the record,
        # and the next attempt gets null (acquired).
        time.sleep(LEASE_S + 0.6)
        out["b_acquire_after_expiry"] = outcome_of(lambda: lb.attempt(R))
        out["a_write_after_takeover"] = outcome_of(lambda: la.write(R, 99))
        out["a_dispose_after_takeover"] = outcome_of(lambda: la.dispose(R))
        out["b_write"] = outcome_of(lambda: lb.write(R, 7))
        out["b_dispose"] = outcome_of(lambda: lb.dispose(R))
        out["a_acquire_after_release"] = outcome_of(lambda: la.attempt(R))
        out["final"] = dc[dbname][Alistair.COLL].find_one({"_id": R})["n"]
    elif lib == "tharga":
        ta = Tharga(da, timeout_s=LEASE_S, actor="A")
        tb = Tharga(db_, timeout_s=LEASE_S, actor="B")
        ddb = dc[dbname][Tharga.COLL]
        ddb.insert_many([{"_id": I(4), "Counter": 0, "Group": "g"}, {"_id": I(5), "Counter": 0, "Group": "g"},
                         {"_id": I(6), "Counter": 0}, {"_id": I(7), "Counter": 0}])
        held = {}

        def pick(t, who, _id):
            e, l = t.pick(_id)
            held[who] = (e, l)
            return "picked" if e is not None else "null"

        out["a_pick"] = outcome_of(lambda: pick(ta, "a", I(1)))
        out["b_pick_early"] = outcome_of(lambda: pick(tb, "b", I(1)))
        time.sleep(LEASE_S + 0.6)
        out["b_pick_after_expiry"] = outcome_of(lambda: pick(tb, "b", I(1)))
        out["a_commit_after_takeover"] = outcome_of(lambda: ta.commit(dict(held["a"][0], Counter=99), held["a"][1]))
        # The vanished holder's scope disposed late: an abandon by _id alone.
        out["a_abandon_after_takeover"] = outcome_of(lambda: ta.abandon(*held["a"]))
        out["b_commit"] = outcome_of(lambda: tb.commit(dict(held["b"][0], Counter=7), held["b"][1]))
        out["final"] = ddb.find_one({"_id": I(1)})["Counter"]
        # The error state: the lock stays, with the exception, until an
        # operator releases it (ReleaseOneAsync, ExceptionOnly).
        out["a_pick_2"] = outcome_of(lambda: pick(ta, "a2", I(2)))
        out["a_error_state"] = outcome_of(lambda: ta.set_error_state(*held["a2"], "failed halfway"))
        out["b_pick_error"] = outcome_of(lambda: pick(tb, "b2", I(2)))
        time.sleep(LEASE_S + 0.6)
        out["b_pick_error_after_expiry"] = outcome_of(lambda: pick(tb, "b2", I(2)))
        out["b_release_exception"] = outcome_of(lambda: shape(tb.release_one_exception_only(I(2))))
        out["b_pick_after_release"] = outcome_of(lambda: pick(tb, "b2", I(2)))
        out["b_commit_2"] = outcome_of(lambda: tb.commit(dict(held["b2"][0], Counter=3), held["b2"][1]))
        # The multi-document pick: one unlocked document of those a filter
        # matches (4 is held, so 5).
        out["a_pick_4"] = outcome_of(lambda: pick(ta, "a4", I(4)))

        def pick_group():
            e, l = tb.pick_filter({"Group": "g"})
            held["bg"] = (e, l)
            return "picked:%d" % (e["_id"] - BASE) if e is not None else "null"

        out["b_pick_group"] = outcome_of(pick_group)
        out["b_commit_group"] = outcome_of(lambda: tb.commit(dict(held["bg"][0], Counter=1), held["bg"][1]))
        out["a_commit_4"] = outcome_of(lambda: ta.commit(dict(held["a4"][0], Counter=1), held["a4"][1]))
        # LockManyAsync in key order with rollback: A holds 7, so B takes 6,
        # fails on 7 and abandons 6; once A is done B takes both.
        out["a_pick_7"] = outcome_of(lambda: pick(ta, "a7", I(7)))
        out["b_lock_many_busy"] = outcome_of(lambda: len(tb.lock_many([I(7), I(6)])))
        out["lock_6_after_rollback"] = ddb.find_one({"_id": I(6)}).get("Lock") is None
        out["a_commit_7"] = outcome_of(lambda: ta.commit(dict(held["a7"][0], Counter=1), held["a7"][1]))

        def many():
            entries = tb.lock_many([I(7), I(6)])
            for e, l in entries:
                tb.commit(dict(e, Counter=e["Counter"] + 10), l)
            return len(entries)

        out["b_lock_many"] = outcome_of(many)
        out["final_4_5_6_7"] = [ddb.find_one({"_id": I(n)})["Counter"] for n in (4, 5, 6, 7)]
    elif lib == "codecentric":
        la, lb = Codecentric(da, aid="A"), Codecentric(db_, aid="B")
        out["a_obtain"] = outcome_of(lambda: la.obtain(I(1)))
        out["b_obtain_early"] = outcome_of(lambda: lb.obtain(I(1)))
        out["b_release_early"] = outcome_of(lambda: lb.release(I(1)))
        # The TTL: on MongoDB the record goes after 30 s (the monitor runs
        # every minute); the next insert then succeeds.
        time.sleep(LEASE_S + 0.6)
        out["b_obtain_after_ttl"] = outcome_of(lambda: lb.obtain(I(1)))
        out["a_write_after_takeover"] = outcome_of(lambda: la.write(I(1), 99))
        out["b_write"] = outcome_of(lambda: lb.write(I(1), 7))
        out["a_release_all_after_takeover"] = outcome_of(lambda: la.release_all())
        out["b_release_all"] = outcome_of(lambda: lb.release_all())
        out["a_obtain_after_release"] = outcome_of(lambda: la.obtain(I(1)))
        out["final"] = dc[dbname][Codecentric.COLL].find_one({"_id": I(1)})["n"]
    print(json.dumps(out, default=str))
    a.close()
    b.close()
    dc.close()


def main():
    global BASE
    lib, mode, uri, direct, db = sys.argv[1:6]
    BASE = int(sys.argv[6])
    HOT[:] = [BASE + 1, BASE + 2, BASE + 3]
    if mode == "work":
        work(lib, uri, direct, db, int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1")
    elif mode == "setup":
        c = client(uri, "lib-setup")
        print(json.dumps(setup_calls(lib, c[db])))
        c.close()
    else:
        takeover(lib, uri, direct, db)


if __name__ == "__main__":
    main()
