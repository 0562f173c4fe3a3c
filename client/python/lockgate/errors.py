"""Typed errors for lockgate's error replies (docs/ERRORS.md)."""

import re

from pymongo.errors import OperationFailure

# lockgate's replies name the lock commands' fields (waitMS, leaseMS, in
# milliseconds); a caller of this helper passed wait= and lease= in
# seconds, and should be told about those.
_OWN_NAMES = ((re.compile(r"\bwaitMS\b"), "wait= (seconds)"), (re.compile(r"\bleaseMS\b"), "lease= (seconds)"))


def _in_own_words(msg):
    for pattern, name in _OWN_NAMES:
        msg = pattern.sub(name, msg)
    return msg


class LockgateError(Exception):
    """A lock command failed. code, code_name, reason, ns, ids and holder
    are those of lockgate's reply when it sent them."""

    def __init__(self, message, code=None, code_name=None, reason=None, ns=None, ids=None, holder=None, command=None):
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.reason = reason
        self.ns = ns
        self.ids = ids or []
        self.holder = holder
        self.command = command


class LockBusy(LockgateError):
    """46 LockBusy: another session holds a lock. Not retried."""


class LockStoreUnavailable(LockgateError):
    """46 LockBusy, reason lockstore_unavailable: retried within the budget."""


class LockTimeout(LockgateError):
    """24 LockTimeout: the wait ran out; nothing was taken."""


class LockNotHeld(LockgateError):
    """107 LockFailed, not_holder: expired, released or force-released."""


class InvalidLockRequest(LockgateError):
    """2 BadValue, 9 FailedToParse, 14 TypeMismatch, 40415 IDLUnknownField,
    or a request the helper refuses before sending (no session)."""


class LockUnauthorized(LockgateError):
    """13 Unauthorized."""


class NotProtected(LockgateError):
    """59 CommandNotFound: the server is not lockgate, nothing enforces locks."""


class LockLost(LockgateError):
    """The lock was lost while held (renewal refused, or the lease ended
    before a renewal succeeded)."""


class _InFlight(LockgateError):
    """107 LockFailed, in_flight: earlier requests still running; retried."""


def from_failure(command, exc):
    """Map a pymongo OperationFailure of a lock command to a typed error."""
    if not isinstance(exc, OperationFailure):
        return exc
    details = exc.details or {}
    lg = details.get("lockgate") or {}
    code = exc.code
    reason = lg.get("reason")
    if code == 46 and reason == "lockstore_unavailable":
        cls = LockStoreUnavailable
    elif code == 46:
        cls = LockBusy
    elif code == 24:
        cls = LockTimeout
    elif code == 107 and reason == "in_flight":
        cls = _InFlight
    elif code == 107:
        cls = LockNotHeld
    elif code in (2, 9, 14, 40415):
        cls = InvalidLockRequest
    elif code == 13:
        cls = LockUnauthorized
    elif code == 59:
        cls = NotProtected
    else:
        return exc
    err = cls(
        "%s: %s (%s %s)" % (command, _in_own_words(details.get("errmsg", str(exc))), code, details.get("codeName")),
        code=code, code_name=details.get("codeName"), reason=reason, ns=lg.get("ns"),
        ids=lg.get("ids"), holder=lg.get("holder"), command=command,
    )
    err.__cause__ = exc
    return err
