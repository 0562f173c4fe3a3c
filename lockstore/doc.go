// Package lockstore keeps lockgate's document locks in MongoDB itself, in
// one collection shared by every proxy instance: acquire (all or nothing,
// in canonical order, optionally waiting), renew, release, inspect, expire,
// force-release, and a fast "does this session hold these locks" check for
// enforcement.
//
// A lock key is (namespace, _id) with _id compared as MongoDB compares it
// (1, NumberLong(1), 1.0 and NumberDecimal("1") are one key). A lock is
// owned by a logical session id (plus an optional stricter binding), has a
// lease measured on the lock store server's clock, and carries a fencing
// token that strictly increases per key across holders and never goes back,
// even when idle records are deleted. docs/LOCKS.md describes the semantics
// and the reasoning behind them.
//
// What it must never do:
//   - grant a lock that another owner holds with an unexpired lease, or say
//     that an owner holds a lock when it cannot know (Holds fails closed:
//     store unreachable means "not held" plus ErrUnavailable);
//   - hand out a token lower than or equal to one handed out before for the
//     same key;
//   - treat a duplicate-key race as anything but an ordinary "busy";
//   - trust the proxy's own clock for lease arithmetic when the server
//     reports its time;
//   - parse or build wire-protocol messages: the proxy maps Store results
//     and errors (ErrBusy -> 46 LockBusy, ErrTimeout -> 24 LockTimeout) to
//     replies;
//   - register metrics globally or log ids above debug level (ids may be
//     personal data; the force-release audit event is the exception).
//
// A Store is safe for concurrent use.
package lockstore
