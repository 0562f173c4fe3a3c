"""Scenarios of the Python helper against a running lockgate, driven by
client/conformance (Go). Prints one JSON line per scenario with what it
observed; the Go test judges. Environment: LOCKGATE_URI (proxy whose lock
store can be cut), DIRECT_URI (the database, no lockgate), CUT_URL (POST
cuts the lock store's connection), DB (database, enforced)."""

import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lockgate  # noqa: E402

URI, DIRECT, CUT, DB = os.environ["LOCKGATE_URI"], os.environ["DIRECT_URI"], os.environ["CUT_URL"], os.environ["DB"]


def out(case, **kw):
    kw["case"] = case
    print(json.dumps(kw, default=str), flush=True)


def err_info(e):
    return {"class": type(e).__name__, "code": getattr(e, "code", None), "reason": getattr(e, "reason", None),
            "holder": getattr(e, "holder", None), "msg": str(e)}


holder = lockgate.connect(URI, app_name="py-holder")
waiter = lockgate.connect(URI, app_name="py-waiter")
coll_h, coll_w = holder[DB]["busy"], waiter[DB]["busy"]

# busy and timeout
with holder.start_session() as hs, waiter.start_session() as ws:
    lk = lockgate.try_acquire(hs, coll_h, [7, 8])
    try:
        lockgate.try_acquire(ws, coll_w, [8])
        out("busy", error=None)
    except lockgate.LockgateError as e:
        out("busy", error=err_info(e), holderTag=lk.holder_tag)
    t0 = time.monotonic()
    try:
        lockgate.acquire(ws, coll_w, [8], wait=0.3)
        out("timeout", error=None)
    except lockgate.LockgateError as e:
        out("timeout", error=err_info(e), elapsedMS=int((time.monotonic() - t0) * 1000))
    lk.release()
    lk2 = lockgate.try_acquire(ws, coll_w, [8])
    out("after_release", token=str(lk2.token))
    lk2.release()

# context manager: an exception releases and is recorded
coll = holder[DB]["withlock"]
with holder.start_session() as s:
    first_token = None
    raised = None
    try:
        with lockgate.lock(s, coll, ["o1"]) as lk:
            first_token = lk.token
            coll.update_one({"_id": "o1"}, {"$set": {"state": "charging"}}, upsert=True, session=s)
            try:
                coll.update_one({"_id": "o1"}, {"$set": {"state": "x"}})  # no session: refused
                outside = None
            except Exception as e:  # noqa: BLE001
                outside = getattr(e, "code", None)
            raise RuntimeError("payment provider said no")
    except RuntimeError as e:
        raised = str(e)
    with holder.start_session() as s2:
        nxt = lockgate.try_acquire(s2, coll, ["o1"])
        out("with_lock", raised=raised, outsideCode=outside, firstToken=str(first_token),
            nextToken=str(nxt.token), lastError=nxt.locks[0].get("lastError"))
        nxt.release()

# a refused renewal sets lost
with holder.start_session() as s:
    lk = lockgate.acquire(s, holder[DB]["refused"], [1], lease=10, renew_every=0.2)
    holder[DB].command({"releaseLock": "refused"}, session=s)
    fired = lk.lost.wait(5)
    try:
        lk.release()
        rel = None
    except lockgate.LockgateError as e:
        rel = type(e).__name__
    out("refused_renewal", lost=fired, error=type(lk.error).__name__ if lk.error else None,
        reason=getattr(lk.error, "reason", None), release=rel)

# lost delivered as a callback, for code that cannot poll: once, with the
# LockLost, from the helper's thread
with holder.start_session() as s:
    calls = []
    called = threading.Event()

    def on_lost(err):
        calls.append((type(err).__name__, getattr(err, "reason", None), threading.current_thread().name))
        called.set()

    lk = lockgate.acquire(s, holder[DB]["callback"], [1], lease=10, renew_every=0.2, on_lost=on_lost)
    holder[DB].command({"releaseLock": "callback"}, session=s)
    fired = called.wait(5)
    time.sleep(0.5)  # a second call, if the helper made one, would land here
    try:
        lk.release()
    except lockgate.LockgateError:
        pass
    out("lost_callback", fired=fired, calls=calls, lostSet=lk.lost.is_set())

# a lock lost inside the with block: leaving it raises LockLost
with holder.start_session() as s:
    raised = None
    try:
        with lockgate.lock(s, holder[DB]["lostwork"], [1], lease=10, renew_every=0.2) as lk:
            holder[DB].command({"releaseLock": "lostwork"}, session=s)
            lk.lost.wait(5)
    except lockgate.LockgateError as e:
        raised = type(e).__name__
    out("lost_in_block", raised=raised)

# not protected, no session
direct = lockgate.connect(DIRECT, app_name="py-direct")
with direct.start_session() as s:
    try:
        lockgate.try_acquire(s, direct[DB]["x"], [1])
        out("not_protected", error=None)
    except lockgate.LockgateError as e:
        out("not_protected", error=err_info(e))
try:
    lockgate.try_acquire(None, coll, [1])
    out("no_session", error=None)
except lockgate.LockgateError as e:
    out("no_session", error=err_info(e))

# renewal through three leases while writing, then the lock store stops
LEASE = 4.0
worker = lockgate.connect(URI, app_name="py-worker")
wcoll = worker[DB]["renew"]
with worker.start_session() as s, holder.start_session() as other:
    lk = lockgate.acquire(s, wcoll, ["job-1"], lease=LEASE)
    tok = lk.token
    t0 = time.monotonic()
    writes, write_err = 0, None
    while time.monotonic() - t0 < 3 * LEASE + LEASE / 3:
        try:
            wcoll.update_one({"_id": "job-1"}, {"$set": {"n": writes, "fence": tok}}, upsert=True, session=s)
            writes += 1
        except Exception as e:  # noqa: BLE001
            write_err = str(e)
            break
        if lk.lost.wait(0.1):
            break
    held_for = time.monotonic() - t0
    try:
        lockgate.try_acquire(other, holder[DB]["renew"], ["job-1"])
        other_err = None
    except lockgate.LockgateError as e:
        other_err = type(e).__name__
    lost_early = lk.lost.is_set()
    token_same = lk.token == tok
    urllib.request.urlopen(urllib.request.Request(CUT, method="POST"), timeout=10).read()
    cut = time.monotonic()
    fired = lk.lost.wait(3 * LEASE)
    lost_after = time.monotonic() - cut
    out("renew_then_cut", leaseMS=int(LEASE * 1000), heldMS=int(held_for * 1000), writes=writes, writeError=write_err,
        otherError=other_err, lostEarly=lost_early, tokenSame=token_same, lost=fired,
        lostAfterMS=int(lost_after * 1000), error=type(lk.error).__name__ if lk.error else None, errorText=str(lk.error))
    os._exit(0)  # the lock store is gone: do not wait for the release and endSessions
