'use strict';
// Typed errors for lockgate's error replies (docs/ERRORS.md).

class LockgateError extends Error {
  constructor(message, fields = {}) {
    super(message);
    this.name = this.constructor.name;
    Object.assign(this, { code: null, codeName: null, reason: null, ns: null, ids: [], holder: null, command: null }, fields);
  }
}
/** 46 LockBusy: another session holds a lock. Not retried. */
class LockBusyError extends LockgateError {}
/** 46 LockBusy, lockstore_unavailable: retried within the budget. */
class LockStoreUnavailableError extends LockgateError {}
/** 24 LockTimeout: the wait ran out; nothing was taken. */
class LockTimeoutError extends LockgateError {}
/** 107 LockFailed, not_holder: expired, released or force-released. */
class LockNotHeldError extends LockgateError {}
/** 2, 9, 14, 40415, or refused before sending (no session). */
class InvalidLockRequestError extends LockgateError {}
/** 13 Unauthorized. */
class LockUnauthorizedError extends LockgateError {}
/** 59 CommandNotFound: not talking to lockgate; nothing enforces locks. */
class NotProtectedError extends LockgateError {}
/** The lock was lost while held. */
class LockLostError extends LockgateError {}
class InFlightError extends LockgateError {}

/** Maps a driver error of a lock command to a typed error; others pass. */
function fromServerError(command, err) {
  if (!err || err.name !== 'MongoServerError' || typeof err.code !== 'number') return err;
  const doc = err.errorResponse || err;
  const lg = doc.lockgate || {};
  const reason = lg.reason || null;
  let Cls;
  if (err.code === 46) Cls = reason === 'lockstore_unavailable' ? LockStoreUnavailableError : LockBusyError;
  else if (err.code === 24) Cls = LockTimeoutError;
  else if (err.code === 107) Cls = reason === 'in_flight' ? InFlightError : LockNotHeldError;
  else if ([2, 9, 14, 40415].includes(err.code)) Cls = InvalidLockRequestError;
  else if (err.code === 13) Cls = LockUnauthorizedError;
  else if (err.code === 59) Cls = NotProtectedError;
  else return err;
  const e = new Cls(`${command}: ${err.message} (${err.code} ${err.codeName})`, {
    code: err.code, codeName: err.codeName, reason, ns: lg.ns || null, ids: lg.ids || [], holder: lg.holder || null, command,
  });
  e.cause = err;
  return e;
}

module.exports = {
  LockgateError, LockBusyError, LockStoreUnavailableError, LockTimeoutError, LockNotHeldError,
  InvalidLockRequestError, LockUnauthorizedError, NotProtectedError, LockLostError, InFlightError, fromServerError,
};
