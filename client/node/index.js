'use strict';
// Document locks through lockgate with the MongoDB Node.js driver. Every
// lock command runs in the caller's explicit session (the lock owner); a
// held lock is renewed in the background, and `lost` settles (and `signal`
// aborts) as soon as a renewal is refused or the lease ends before one
// succeeded. Only what may be retried is retried. See docs/CLIENTS.md.
//
// JavaScript runs one callback at a time, so renewals can share the
// caller's ClientSession: there is no concurrent access to guard against.

const { MongoClient } = require('mongodb');
const { performance } = require('node:perf_hooks');
const errors = require('./errors');

const {
  LockStoreUnavailableError, InFlightError, InvalidLockRequestError, LockLostError, LockNotHeldError, fromServerError,
} = errors;

/** A MongoClient with the application name lockgate shows as the holder. */
function connect(uri, appName, options = {}) {
  if (!appName) throw new InvalidLockRequestError('an application name is required: lockgate shows it as the holder of your locks');
  return new MongoClient(uri, { ...options, appName });
}

function retryable(err) {
  if (err instanceof LockStoreUnavailableError || err instanceof InFlightError) return true;
  if (!err) return false;
  return ['MongoNetworkError', 'MongoNetworkTimeoutError', 'MongoServerSelectionError'].includes(err.name);
}

const backoff = (n) => Math.min(50 * 2 ** (n - 1), 1000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

function database(coll) {
  // The public way to a collection's database: its client and dbName.
  return coll.client ? coll.client.db(coll.dbName) : coll.s.db;
}

async function command(coll, session, name, cmd) {
  try {
    // Tokens are 64-bit and start near the server clock in nanoseconds,
    // past Number's 53 bits: read every int64 as a BigInt.
    return await database(coll).command(cmd, { session, useBigInt64: true });
  } catch (err) {
    throw fromServerError(name, err);
  }
}

class Lock {
  constructor(session, coll, ids, o, reply, sent) {
    this._session = session;
    this._coll = coll;
    this._ids = ids;
    this._o = o;
    this._locks = reply.locks || [];
    // The holder tag others see for these locks (holder.tag in refusals,
    // lockStatus and the admin views); not the session id.
    this.holderTag = (reply.holder || {}).tag;
    this._deadline = sent + o.leaseMS;
    this._failures = 0;
    this._lastError = null;
    this._released = false;
    this._ended = false;
    this.error = null;
    this._ac = new AbortController();
    /** Aborted when the lock ends (lost or released); reason = the error. */
    this.signal = this._ac.signal;
    /** Settles with the LockLostError when the lock is lost (never on release). */
    this.lost = new Promise((resolve) => { this._resolveLost = resolve; });
    this._armWatch();
    if (!o.noRenew) this._schedule(o.renewEveryMS);
  }

  get locks() { return this._locks.slice(); }
  /** The fencing token of the first (for one id, the only) lock. */
  get token() { return this._locks.length ? this._locks[0].token : null; }

  _armWatch() {
    clearTimeout(this._watch);
    const left = this._deadline - this._o.marginMS - now();
    this._watch = setTimeout(() => {
      const why = 'the lease ended before a renewal succeeded' + (this._lastError ? `: ${this._lastError.message}` : '');
      this._lose(new LockLostError(why, { reason: 'lease_ended' }));
    }, Math.max(left, 0));
  }

  _schedule(ms) {
    clearTimeout(this._timer);
    this._timer = setTimeout(() => this._renewTick(), ms);
  }

  _lose(err) {
    if (this._ended) return;
    this._ended = true;
    clearTimeout(this._timer);
    clearTimeout(this._watch);
    this.error = err;
    this._resolveLost(err);
    this._ac.abort(err);
  }

  async _renewOnce() {
    const sent = now();
    const reply = await command(this._coll, this._session, 'renewLock',
      { renewLock: this._coll.collectionName, ids: this._ids, leaseMS: this._o.leaseMS });
    if (this._ended) return;
    if (reply.locks && reply.locks.length) this._locks = reply.locks;
    this._deadline = Math.max(this._deadline, sent + this._o.leaseMS);
    this._lastError = null;
    this._armWatch();
  }

  async _renewTick() {
    if (this._ended) return;
    try {
      await this._renewOnce();
      this._failures = 0;
      if (!this._ended) this._schedule(this._o.renewEveryMS);
    } catch (err) {
      if (this._ended) return;
      if (!retryable(err)) {
        this._lose(Object.assign(new LockLostError(`renewal refused: ${err.message}`, { reason: err.reason || null }), { cause: err }));
        return;
      }
      this._failures += 1;
      this._lastError = err;
      this._schedule(Math.min(backoff(this._failures), this._o.renewEveryMS));
    }
  }

  /** Renew now (needed only with noRenew). */
  async renew() {
    if (this.error) throw this.error;
    await this._renewOnce();
  }

  /**
   * Stop renewing and release the locks; errText is kept as the locks'
   * lastError for the next holder. Rejects with LockNotHeldError when some
   * lock was no longer held. A second call does nothing.
   */
  async release(errText) {
    if (this._released) return;
    this._released = true;
    const wasLost = this._ended;
    this._ended = true;
    clearTimeout(this._timer);
    clearTimeout(this._watch);
    if (!wasLost) this._ac.abort(new Error('lockgate: lock released'));
    const cmd = { releaseLock: this._coll.collectionName, ids: this._ids };
    if (errText) cmd.error = String(errText);
    let reply;
    for (let attempt = 1; ; attempt++) {
      try {
        reply = await command(this._coll, this._session, 'releaseLock', cmd);
        break;
      } catch (err) {
        if (!retryable(err) || attempt >= this._o.attempts) throw err;
        await sleep(backoff(attempt));
      }
    }
    if ((reply.released || 0) < this._locks.length) {
      throw new LockNotHeldError(`released ${reply.released} of ${this._locks.length} locks; the others were no longer held by this session (expired, taken over or force-released)`,
        { code: 107, reason: 'not_holder' });
    }
  }
}
if (Symbol.asyncDispose) {
  Lock.prototype[Symbol.asyncDispose] = function dispose() { return this.release(); };
}

function options(o = {}) {
  const leaseMS = o.leaseMS || 30000;
  return {
    leaseMS,
    waitMS: o.waitMS === undefined ? 30000 : o.waitMS,
    renewEveryMS: o.renewEveryMS || Math.floor(leaseMS / 3),
    marginMS: o.marginMS || Math.floor(leaseMS / 5),
    noRenew: !!o.noRenew,
    attempts: o.attempts || 3,
  };
}

async function take(session, coll, ids, o) {
  if (!session || typeof session.startTransaction !== 'function') {
    throw new InvalidLockRequestError('a session is required: locks belong to a logical session, so lock and write in one explicit session (client.startSession())');
  }
  if (session.inTransaction()) throw new InvalidLockRequestError('lock commands cannot run inside a transaction: acquire before startTransaction');
  if (!coll || !Array.isArray(ids) || ids.length === 0) throw new InvalidLockRequestError('a collection and at least one _id are required');
  const waitEnd = now() + o.waitMS;
  for (let attempt = 1; ; attempt++) {
    const sent = now();
    try {
      const reply = await command(coll, session, 'acquireLock', {
        acquireLock: coll.collectionName, ids, leaseMS: o.leaseMS,
        waitMS: o.waitMS > 0 ? Math.max(Math.floor(waitEnd - now()), 0) : 0,
      });
      return new Lock(session, coll, ids, o, reply, sent);
    } catch (err) {
      // A lost reply may have taken the locks: they end with their lease,
      // as a crashed client's would.
      if (!retryable(err) || attempt >= o.attempts) throw err;
      await sleep(backoff(attempt));
    }
  }
}

/** Take the locks on ids, all or nothing, waiting up to waitMS (default 30 s). */
function acquire(session, coll, ids, opts) { return take(session, coll, ids, options(opts)); }

/** acquire without waiting: a lock held by another session rejects with LockBusyError. */
function tryAcquire(session, coll, ids, opts) { return take(session, coll, ids, { ...options(opts), waitMS: 0 }); }

/**
 * Acquire, run fn(lock, signal) (signal aborts if the lock is lost), and
 * always release, recording fn's error as the locks' lastError. If the
 * lock was lost while fn ran, rejects with the LockLostError even when fn
 * succeeded: the work may not have been exclusive.
 */
async function withLock(session, coll, ids, opts, fn) {
  const lock = await acquire(session, coll, ids, opts);
  let result;
  try {
    result = await fn(lock, lock.signal);
  } catch (err) {
    const lost = lock.error;
    await lock.release(`${err && err.name ? err.name + ': ' : ''}${err && err.message ? err.message : err}`).catch((e) => { if (!lost) throw e; });
    throw err;
  }
  const lost = lock.error;
  await lock.release().catch((e) => { if (!lost) throw e; });
  if (lost) throw lost;
  return result;
}

module.exports = { connect, acquire, tryAcquire, withLock, Lock, ...errors };
