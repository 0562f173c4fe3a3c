"""Document locks through lockgate with pymongo.

Every lock command runs in the caller's explicit session (the lock owner);
a held lock is renewed in the background and ``lost`` is set as soon as a
renewal is refused or the lease ends before one succeeded. Only what may be
retried is retried. See docs/CLIENTS.md.

pymongo's ClientSession is not thread-safe, and renewals run on a thread of
their own while the caller writes in the session. So the helper never sends
anything through the caller's ClientSession object: it starts a session of
its own on the same client and gives it the caller's logical session id,
so its commands carry the caller's lsid while its bookkeeping stays apart.
The borrowed id is never returned to pymongo's pool.
"""

import copy
import logging
import threading
import time

from pymongo import MongoClient
from pymongo.errors import AutoReconnect, ExecutionTimeout, NetworkTimeout, OperationFailure

from .errors import (  # noqa: F401 (re-exported)
    InvalidLockRequest, LockBusy, LockgateError, LockLost, LockNotHeld, LockStoreUnavailable,
    LockTimeout, LockUnauthorized, NotProtected, _InFlight, from_failure,
)

__all__ = [
    "connect", "acquire", "try_acquire", "lock", "Lock",
    "LockgateError", "LockBusy", "LockStoreUnavailable", "LockTimeout", "LockNotHeld",
    "InvalidLockRequest", "LockUnauthorized", "NotProtected", "LockLost",
]


def connect(uri, app_name, **kwargs):
    """A MongoClient for uri with the application name lockgate shows as the
    holder of your locks. app_name is required."""
    if not app_name:
        raise InvalidLockRequest("an application name is required: lockgate shows it as the holder of your locks")
    return MongoClient(uri, appname=app_name, **kwargs)


def _retryable(err):
    if isinstance(err, (LockStoreUnavailable, _InFlight)):
        return True
    return isinstance(err, (AutoReconnect, NetworkTimeout, ExecutionTimeout))


def _backoff(attempt):
    return min(0.05 * (2 ** (attempt - 1)), 1.0)


class _Twin(object):
    """A session of the helper's own that sends the caller's lsid."""

    def __init__(self, session):
        if session is None or not hasattr(session, "_server_session"):
            raise InvalidLockRequest(
                "a session is required: locks belong to a logical session, so lock and write in one "
                "explicit session (client.start_session())")
        if session.in_transaction:
            raise InvalidLockRequest("lock commands cannot run inside a transaction: acquire before start_transaction")
        self._session = session.client.start_session(causal_consistency=False)
        # pymongo 4 may start a session's server session lazily; reading
        # the id makes both real before the swap.
        _ = session.session_id, self._session.session_id
        self._own = self._session._server_session
        borrowed = copy.copy(self._own)
        borrowed.session_id = session.session_id
        self._session._server_session = borrowed
        self._mu = threading.Lock()
        self._ended = False

    def command(self, db, cmd):
        with self._mu:
            if self._ended:
                raise InvalidLockRequest("the lock was released")
            return db.command(cmd, session=self._session)

    def end(self):
        with self._mu:
            if not self._ended:
                self._ended = True
                self._session._server_session = self._own
                self._session.end_session()


class Lock(object):
    """Held document locks. Use as a context manager to release on exit
    (an exception's text is recorded as the locks' lastError).

    token: the fencing token of the first (for one id, the only) lock.
    locks: [{"_id", "token", "expiresAt", "lastError"?}] as lockgate granted them.
    lost: a threading.Event set when the lock is lost; error says why.
    on_lost (given to acquire): called once, with the LockLost error, from
    the helper's own thread when the lock is lost, for code that cannot
    poll lost; it must not block.
    """

    def __init__(self, twin, collection, ids, lease, renew_every, margin, auto_renew, attempts, reply, sent, on_lost=None):
        self._twin = twin
        self._db = collection.database
        self._coll = collection.name
        self._ids = list(ids)
        self._lease = lease
        self._renew_every = renew_every
        self._margin = margin
        self._attempts = attempts
        self._mu = threading.Condition()
        self._locks = reply.get("locks", [])
        # The holder tag others see for these locks (holder.tag in
        # refusals, lockStatus and the admin views); not the session id.
        self.holder_tag = (reply.get("holder") or {}).get("tag")
        self._deadline = sent + lease
        self.lost = threading.Event()
        self._on_lost = on_lost
        self.error = None
        self._stop = threading.Event()
        self._released = False
        self._threads = [threading.Thread(target=self._watch, name="lockgate-watch", daemon=True)]
        if auto_renew:
            self._threads.append(threading.Thread(target=self._renew_loop, name="lockgate-renew", daemon=True))
        for t in self._threads:
            t.start()

    @property
    def locks(self):
        with self._mu:
            return list(self._locks)

    @property
    def token(self):
        locks = self.locks
        return locks[0]["token"] if locks else None

    def _lose(self, err):
        with self._mu:
            if self.lost.is_set() or self._stop.is_set():
                return
            self.error = err
            self.lost.set()
            self._mu.notify_all()
        self._notify_lost(err)

    def _notify_lost(self, err):
        # Outside the lock: the callback may read locks or token.
        if self._on_lost is None:
            return
        try:
            self._on_lost(err)
        except Exception:  # noqa: BLE001 (the caller's code must not stop the helper)
            logging.getLogger("lockgate").exception("on_lost callback raised")

    def _watch(self):
        # Fires lost at the local lease end minus the margin, independent of
        # a renewal that may be hanging.
        with self._mu:
            while not self._stop.is_set() and not self.lost.is_set():
                left = self._deadline - self._margin - time.monotonic()
                if left <= 0:
                    break
                self._mu.wait(left)
            if self._stop.is_set() or self.lost.is_set():
                return
            last = getattr(self, "_last_error", None)
            why = "the lease ended before a renewal succeeded"
            if last is not None:
                why += ": %s" % (last,)
            self.error = LockLost(why, reason="lease_ended")
            self.lost.set()
            self._mu.notify_all()
            err = self.error
        self._notify_lost(err)

    def _renew_once(self):
        sent = time.monotonic()
        try:
            reply = self._twin.command(self._db, {"renewLock": self._coll, "ids": self._ids, "leaseMS": int(self._lease * 1000)})
        except OperationFailure as exc:
            raise from_failure("renewLock", exc)
        with self._mu:
            if reply.get("locks"):
                self._locks = reply["locks"]
            self._deadline = max(self._deadline, sent + self._lease)
            self._last_error = None
            self._mu.notify_all()

    def renew(self):
        """Renew now (needed only with auto_renew=False)."""
        if self.lost.is_set():
            raise self.error
        self._renew_once()

    def _renew_loop(self):
        failures = 0
        delay = self._renew_every
        while not self._stop.wait(delay):
            if self.lost.is_set():
                return
            try:
                self._renew_once()
                failures, delay = 0, self._renew_every
            except Exception as err:  # noqa: BLE001 (classified below)
                if self._stop.is_set():
                    return
                if not _retryable(err):
                    lost = LockLost("renewal refused: %s" % (err,), reason=getattr(err, "reason", None))
                    lost.__cause__ = err
                    self._lose(lost)
                    return
                failures += 1
                with self._mu:
                    self._last_error = err
                delay = min(_backoff(failures), self._renew_every)

    def release(self, error=None):
        """Stop renewing and release the locks. error (text) is kept as the
        locks' lastError for the next holder. Raises LockNotHeld when some
        lock was no longer held. A second call does nothing."""
        with self._mu:
            if self._released:
                return
            self._released = True
            self._stop.set()
            self._mu.notify_all()
        cmd = {"releaseLock": self._coll, "ids": self._ids}
        if error:
            cmd["error"] = str(error)
        try:
            for attempt in range(1, self._attempts + 1):
                try:
                    reply = self._twin.command(self._db, cmd)
                    break
                except OperationFailure as exc:
                    err = from_failure("releaseLock", exc)
                except Exception as exc:  # noqa: BLE001
                    err = exc
                if not _retryable(err) or attempt == self._attempts:
                    raise err
                time.sleep(_backoff(attempt))
        finally:
            self._twin.end()
        n = reply.get("released", 0)
        if n < len(self._locks):
            raise LockNotHeld("released %d of %d locks; the others were no longer held by this session "
                              "(expired, taken over or force-released)" % (n, len(self._locks)), code=107, reason="not_holder")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        lost = self.lost.is_set()
        try:
            self.release(error=("%s: %s" % (exc_type.__name__, exc)) if exc is not None else None)
        except LockNotHeld:
            if not lost:
                raise
        if exc is None and lost:
            # The work finished, but perhaps not alone: say so.
            raise self.error
        return False


def _acquire(session, collection, ids, lease, wait, renew_every, margin, auto_renew, attempts, on_lost=None):
    if collection is None or not ids:
        raise InvalidLockRequest("a collection and at least one _id are required")
    twin = _Twin(session)
    wait_end = time.monotonic() + wait
    attempt = 0
    while True:
        attempt += 1
        cmd = {"acquireLock": collection.name, "ids": list(ids), "leaseMS": int(lease * 1000),
               "waitMS": int(max(wait_end - time.monotonic(), 0) * 1000) if wait > 0 else 0}
        sent = time.monotonic()
        try:
            reply = twin.command(collection.database, cmd)
            break
        except OperationFailure as exc:
            err = from_failure("acquireLock", exc)
        except Exception as exc:  # noqa: BLE001
            err = exc
        if not _retryable(err) or attempt >= attempts:
            # A lost reply may have taken the locks: they end with their
            # lease, as a crashed client's would.
            twin.end()
            raise err
        time.sleep(_backoff(attempt))
    return Lock(twin, collection, ids, lease, renew_every or lease / 3.0, margin or lease / 5.0,
                auto_renew, attempts, reply, sent, on_lost)


def acquire(session, collection, ids, lease=30.0, wait=30.0, renew_every=None, margin=None, auto_renew=True, attempts=3,
            on_lost=None):
    """Take the locks on ids in collection, all or nothing, in session,
    waiting up to wait seconds for locks held by others (LockTimeout after
    that). Times are in seconds. The lock is renewed every renew_every
    (default lease/3) until released; lost is set, and on_lost(error)
    called, when a renewal is refused or the lease (minus margin, default
    lease/5) ends first."""
    return _acquire(session, collection, ids, lease, wait, renew_every, margin, auto_renew, attempts, on_lost)


def try_acquire(session, collection, ids, lease=30.0, **kwargs):
    """acquire without waiting: a lock held by another session raises LockBusy."""
    kwargs.pop("wait", None)
    return _acquire(session, collection, ids, lease, 0, kwargs.get("renew_every"), kwargs.get("margin"),
                    kwargs.get("auto_renew", True), kwargs.get("attempts", 3), kwargs.get("on_lost"))


lock = acquire
"""``with lockgate.lock(s, coll, ids) as lk:`` - acquire, and release on exit."""
