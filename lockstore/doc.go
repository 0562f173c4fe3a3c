// Package lockstore keeps lockgate's document locks in MongoDB itself, in
// one collection shared by every proxy instance: acquire (all or nothing,
// in canonical order, optionally waiting), renew, release, inspect, expire,
// force-release, and a fast "does this session hold these locks" check for
// enforcement.
//
// A lock key is (namespace, _id) with _id compared as MongoDB compares it
// (1, NumberLong(1), 1.0 and NumberDecimal("1") are one key). Ids come in
// as docid.IDs, already validated and carrying that canonical key, so the
// store only names records by it; the bytes the caller sent come back in
// every Lock, Status and error. A lock is
// owned by a logical session id (plus an optional stricter binding), has a
// lease measured on the lock store server's clock, and carries a fencing
// token that strictly increases per key across holders and never goes back,
// even when idle records are deleted. docs/LOCKS.md describes the semantics
// as users of the lock commands see them.
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
//     personal data). The audit trails are the exceptions, because
//     recording ids is what they are for: the force-release event here,
//     and the guard's one line per decision on a protected namespace.
//
// A Store is safe for concurrent use.
//
// The rest of this comment is how the store keeps docs/LOCKS.md's promises:
// the storage format, the Store methods, the cache behind Holds, and what
// the embedded FerretDB changes. Users of the lock commands need none of it.
//
// # Storage: claims and head documents
//
// Records live in two collections shared by every proxy instance: the lock
// collection (default `lockgate.locks`) and its claims collection
// (`lockgate.locks_claims`). Every change of a key (grant, renew, release,
// force-release) creates the next *generation* of its state, `seq + 1`, and
// stores it twice:
//
//  1. a **claim** in the claims collection, `_id = <key>#<seq as 16 hex
//     digits>`, inserted once and never modified. Only one inserter of a given generation can succeed (the
//     unique `_id` index), so "insert claim seq+1" is an atomic
//     compare-and-swap; a duplicate-key error is an ordinary "someone changed
//     the key first", never an error to the client;
//  2. the key's **head document** in the lock collection, `_id = <key>`,
//     `head: true`, replaced after the claim succeeded. It is the one fast
//     place (lookup by `_id`) to read a key's state; the lock collection holds
//     one document per key, so its scans stay small. `<key>` is
//     `<namespace>/<hex of the canonical key>` (or `/#<sha256>` when long).
//
// Why not the usual conditional `findOneAndUpdate` upsert? Because FerretDB
// v1.24, the upstream the tests run against, implements `findAndModify` and
// `update` as "query, then rewrite by `_id`" without any atomicity (its
// source says so: FerretDB issue 2168). A conditional upsert lock on it
// grants the same lock twice under contention; our 50-worker invariant test
// caught exactly that (two holders with the same token). An insert with a
// unique `_id` is atomic on every MongoDB-compatible server, so the lock
// store uses nothing else to decide a change.
//
// A head document can lag behind the newest claim: for the milliseconds
// between the two writes, or until the next change of the key if the writer
// failed between them (the operation then returns `ErrUnavailable`, so its
// caller does not rely on it). Writers notice a lagging head through the
// duplicate claim, read the claim that won and go on from it. The head
// write is not conditional (FerretDB answers only a pure `_id` filter from
// an index, and rewrites by `_id` after its query anyway), so a slower
// writer of an older generation can also move the head document back,
// until the next change of the key: to a hold that has ended since (a
// holder's renewal overtaken by its own release and another owner's
// acquire). Every read of a head document that names a holder whose lease
// may not have ended therefore also reads the claim after it (one lookup
// by exact `_id`) and goes on to the newest claim if there is one (`heads`,
// `newest`): Holds, Status, List and the background confirmation never
// answer from a moved-back head (`TestHeadMovedBackHoldsNobody`). The
// newest claim is searched for with exact `_id` reads, the only ones
// FerretDB answers from an index (`$in` and ranges scan the claims): the
// distance ahead doubles while claims are found, then halves between the
// newest found and the first missing one, so a key that gains generations
// as fast as a reader reads them is overtaken in a few reads, and the
// answer is a generation that was the newest at some moment during the
// read (`TestHeadBehindAKeyThatKeepsChanging`). A tombstone of the key's
// previous life ahead of its new one counts only where the claim before
// it exists (`TestTombstoneNearAMovedBackHead`). Writers
// decide on the head as read: the claims refuse whatever a stale head
// would wrongly allow. What a stale head would wrongly refuse, a writer
// checks: a refusal (a holder's renewal or release on a head that shows
// the key released or held by another, an acquire on a hold that has
// ended) stands only after the same search finds nothing newer, and a
// writer whose claim meets a duplicate goes on from the newest claim, not
// one generation at a time (`TestHolderRenewsOverAMovedBackFreeHead`,
// `TestAcquireOverAHeadBehindARelease`,
// `TestForceReleaseOverAHeadFarBehind`).
// A head that shows no holder, or an ended hold, is not checked: it can
// only make a reader say "not held". One such answer is checked all the
// same: Holds and HeldTokens, before they tell an owner that it does not
// hold a key this Store granted or renewed it (the owned index), search
// the claims after the head. A release through another Store whose head
// write lands after this Store's grant leaves exactly that head, and the
// holder's writes through the lockgate it locked through were refused as
// unlocked until its next change of the key
// (`TestHolderHeldOverAHeadMovedBackToARelease`). Compaction keeps the
// claims after a key's head (compactClaims): a head moved back behind them
// stays noticeable until a writer moves it past them. Without that, a
// stale head read as current handed out a token again, or, free, let a
// second owner take a key held under a younger claim
// (`TestStaleHeadAfterCompaction`, `TestStaleFreeHeadAfterCompaction`).
// So the janitor alone deletes claims, on every server: the claims never
// have a TTL index, which would delete them by age whatever the heads say
// (see Indexes below).
//
// Claims are **compacted**: the janitor (every `CleanupInterval`) deletes
// claims older than `CleanupAfter` (default 10 min, at least 1 min and 12 x
// `OpTimeout`). A claim is only needed while someone may still try to insert
// the same generation: a writer whose view of the key is older than that. Views
// come from head documents read milliseconds earlier and from the local cache,
// which is used as a starting point only while younger than
// min(`CleanupAfter`/8, 30 s). The assumption, stated plainly: **no single
// store operation takes longer than `CleanupAfter`** (each round trip is cut
// at `OpTimeout`). Head documents of keys that nobody has held or changed
// for `CleanupAfter` are deleted too (`CollectHeads`, run by the janitor
// after compaction, at most 1000 per pass), in two steps: the janitor first
// inserts a **tombstone** claim (kind `gc`) as the key's next generation, an
// ordinary compare-and-swap, so that no writer can change the key from the
// state being deleted; then it deletes the head document if it still shows
// that state. A writer whose duplicate claim turns out to be a tombstone takes
// the key as new and starts it afresh (generation 1, token from the server
// clock in nanoseconds, above every token of the key's previous life, which
// was idle for `CleanupAfter`); a new life of the key that reaches the
// tombstone's generation before compaction removes it sees that the
// tombstone is older than its own head and steps over it. On FerretDB the
// delete is not conditional in fact; if it races a writer that has just
// restarted the key, the new head document can be lost, which readers take
// as "not held" (fail closed) until the holder's next change, while the
// claims still decide every change correctly.
//
// Document fields: `key`, `seq`, `ns`, `id` (the `_id` as first locked, for
// display), `kind` (`acquire`, `renew`, `release`, `force-release`,
// `handoff`: a release that grants the key to a local waiter, see
// handoff.go), `owner`
// (session id, binary subtype 4, null when free), `bind`, `ownerApp`,
// `ownerClient`, `token`, `acquiredAt`, `expiresAt` (1970-01-01 when free),
// `at` (time of the change), `lastError`, `reason` (force-release), `via`
// (a random name of the store, drawn when it opens, that wrote the
// generation), `shared` (the hold was changed through more than one store;
// see "Cache and Holds").
// Indexes: `{owner:1, ns:1}` (endSessions, release-all) and `{expiresAt:1}`
// (the admin list) on the lock collection, a plain `{at:1}` (compaction)
// on the claims collection, never a TTL index there nor on the heads
// (deleting heads would reset tokens). Versions before this one made the
// claims' `at_1` a TTL index (`expireAfterSeconds` = `CleanupAfter`)
// where the server allows one (MongoDB; FerretDB refuses them). At start
// the store lists the claims' indexes, drops an index on exactly `{at:1}`
// that has `expireAfterSeconds` (by name, logged at Info) and makes the
// plain one (claimsindex.go). If the drop is refused (a user without
// `dropIndex`), the store starts all the same, logs at Error level the
// command that ends the gap (`db.<claims>.dropIndex("at_1")`, in the lock
// store's database) and why, and sets the gauge
// `lockgate_lockstore_claims_ttl_indexes`; a TTL index on other keys of
// the claims is reported the same way and never dropped, and so is a
// plain create refused because `at_1` is there with other options (an
// older lockgate starting between the drop and the create made it again)
// (`TestClaimsTTLIndexDroppedAtStart`, `TestClaimsTTLIndexDropRefused`,
// `TestClaimsTTLIndexMadeAgainMeanwhile`, `TestClaimsIndexIsNeverTTL`).
//
// # Operations
//
//	| Store method | semantics |
//	|---|---|
//	| `Acquire(owner, ns, ids, lease, wait)` | all-or-nothing. Keys are taken one by one in canonical order (sorted by canonical key); if one is held by another owner, the keys this call newly took are released again (keys the owner already held stay held) and the call fails (`wait` 0: `*HeldError` matching `ErrBusy`) or waits and retries (see Waiting; `ErrTimeout` when `wait` elapses). An id the owner already holds is re-entrant: same token, lease set to end `lease` from now. A lock can be taken on an `_id` that does not exist yet. `lease` 0 = `DefaultLease`; over `MaxLease` or negative = `ErrInvalidLease`. A lease that ended without a release is taken over only `TakeoverGrace` after its end. A context from `WithTokenFloors` (the fence stamps the guard read) gives each id a floor: a grant to a new holder gets a token above it, unless it is more than an hour ahead of the server's time. |
//	| `Renew(owner, ns, ids, lease)` | sets the lease to end `lease` from now for ids the owner holds and whose lease has not ended; the others are reported in a `*NotHolderError` (`ErrNotHolder`). Tokens are kept. |
//	| `Release(owner, ns, ids, errText)` / `ReleaseAll(owner, ns, errText)` | frees the ids the owner holds (even if the lease ended, as long as nobody took them over) and returns how many; ids not held just do not count. `ReleaseAll` finds the owner's keys from the heads that name it and from its claims (a scan of the claims on FerretDB; at most four release-alls look at once, the others wait their turn), so a key whose head was moved back to another owner's hold is freed too. A non-empty `errText` is kept as `lastError` and shown to the next holder (`Lock.LastError`, `Status`); a clean release clears it; rollback and `ReleaseSession` keep it. |
//	| `ReleaseSession(session)` | `endSessions`: frees everything the session holds, whatever its binding: what it took through this instance at once (the owned index, no query), what it took through other instances by a background sweep that serves every session ended meanwhile with one query by owner of the heads and one of the claims (so a key whose head was moved back to another owner's hold is freed too), at most once a second, and spending at most a fifth of the time on it. |
//	| `Status(owner, ns, ids)` | one read; held, held by you, holder (app, session prefix, client), since, expires, token, last error. |
//	| `ConfirmedStatus(owner, ns, ids)` | `Status` that also reads the claims after each head record (a head can lag behind them and would read as not held): for decisions where "not held" lets a write through, such as the insert check. |
//	| `List(opts)` | admin view of held (or all) keys: namespace, id, holder app and session prefix, since, expires, token, last error. |
//	| `ForceRelease(ns, id, reason)` | operators: frees the key whoever holds it, token + 1, `reason` stored on the generation, audit event logged at warn level; returns the state before. A key held in memory (a legacy write's lock) is waited for until its write has ended, bounded by ctx (`ErrHeldInMemory`). |
//	| `ForceReleaseOf(ns, id, token, reason)` | `ForceRelease` of the holding with that token only (0: a lock held in memory); a key that changed hands since fails with `ErrChangedHands` and nothing changes. What the admin API uses when the operator's request names the token it saw. |
//	| `Holds(owner, ns, ids, margin)` | enforcement: does the owner hold every id with at least `margin` of lease left? See "Cache". |
//	| `HeldTokens(owner, ns, ids, margin)` | `Holds` that also returns each id's token (the document fence stamps and checks them) and the lease the earliest of them surely has left (the proxy's deadline, `maxTimeMS` cap and in-flight renewals). |
//	| `HeldTokensInto(owner, ns, ids, margin, tokens)` | `HeldTokens` into the caller's slice: one id that the cache vouches for (the same trust rule) is answered without an allocation, the record id built on the stack; anything else takes `HeldTokens`' path. What the guard calls on every enforced write. |
//	| `RecordTxn(session, txn, needs)` / `BeginCommit(session, txn)` / `EndTxn(session, txn)` | what a transaction's commit needs (txn.go): each statement's needs are a document of their own in the transactions collection (`lockgate.locks_txns`), `_id = <session hex>:<txnNumber>:<slot>`, slots from 0, inserted once (fields `s`, `n`, `at`, `needs`, or `seal`); `BeginCommit` inserts a seal in the next slot and returns everything below it, and `RecordTxn` refuses (`ErrTxnCommitting`) to go above a seal; `EndTxn` deletes the slots once the server answered the commit or abort. Reads and deletes are by `_id` only; the janitor deletes records older than `TxnRetention` (1 h). |
//	| `Ping`, `Cleanup`, `CollectHeads`, `Close` | reachability, compaction, deletion of idle keys, shutdown. |
//
// Errors: `ErrBusy` and `ErrTimeout` come as `*HeldError` carrying the
// holder's app name, holder tag (first 4 bytes of the owner key, hex), token
// and lease end, and an `Error()` text like `lock on shop.orders _id 7 held by
// app "billing" holder tag 1a2b3c4d until 2026-01-02T03:04:05Z`; the proxy maps them to codes
// 46 `LockBusy` and 24 `LockTimeout`. `ErrUnavailable` wraps the cause when
// the store cannot be reached or refuses the operation (each round trip,
// including server selection, is bounded by `OpTimeout`, default 5 s).
// `ErrInvalidID` (docid.ErrInvalid: the zero ID here, since package docid
// refuses an invalid _id before it becomes an ID), `ErrInvalidLease`,
// `ErrInvalidArgument` (no session, no ids, bad namespace, negative wait)
// take nothing. `Open` fails only for an
// invalid configuration: an unreachable database is reported by the
// operations and `Ping`, and retried in the background, so a proxy can start
// before its database (its `/readyz` should use `Ping`).
//
// # Cache and Holds
//
// Each store keeps the last state it wrote or read per key. `Holds` answers
// from it, without a round trip, only for a generation this store wrote
// itself (`via`), with enough lease left, and only for the cache's trust
// period (1 s; not a configuration key, and the same in every instance)
// after a moment before which no newer generation's head document was
// written: the moment before its claim was sent, or before a read of its
// head document that found it. A background task re-reads, twice per
// trust period and in two round trips (the head documents, and the claims
// after them), the head documents of the cached locks this store wrote,
// so that writes under a lock held through this proxy are answered from
// memory for the whole lease; a lock whose head shows another generation
// is read again by the next check. A lock whose newest generation another
// store wrote (taken, renewed or changed through another proxy) is read
// from its head document and the claim after it on every check.
//
// A release, force-release, handoff or session release through one store
// of a hold that another store may still trust (its newest generation was
// written elsewhere, or the hold was changed through more than one store:
// `shared`) first writes a generation of the same hold (kind `renew`, the
// lease unchanged) and waits one trust period (plus 1/64 for the two
// machines' clock rates) after that generation's head document was
// written, counted in `lockgate_lock_quiesce_waits_total`; only then does
// it free the key. The other store trusted the old generation from a
// moment before that head write at the latest (a head write lands once,
// before its writer returns, so a head never goes back to a generation
// after a newer one was read), so its trust has run out by then, and its
// next check reads the store. So once such a change has returned, no store answers
// "held" for the old holder, and no new holder is granted the key before
// that. The cost: up to a second and two round trips on a release through
// another proxy than the one the lock was last taken or renewed through;
// releases through the same proxy do not wait. A lease that surely ended
// is trusted nowhere, so a takeover does not wait. `Holds` fails closed: on
// any store error it answers "not held" with `ErrUnavailable`.
//
// `MayHoldLocks`, which lets an insert skip the per-`_id` check, answers
// from a view of the namespaces with held locks (one `distinct` twice per
// trust period), trusted only by a store that knows it is alone: every
// store upserts a heartbeat into `<collection>_instances` (`_id` = its
// `via`) and reads whether another was seen in the last 30 s; a store that
// found another grants its first lock NewcomerHorizon (at least one trust
// period) after its own heartbeat was acknowledged (instances.go gives the
// argument), and one whose last heartbeat is over 10 s old grants none.
// Close deletes the record, unless a write under a memory lock may still
// run.
//
// `AcquireInMemory` holds a legacy write's implicit locks in the store's
// memory while it is alone, with no round trip; acquires through the
// store refuse or queue behind them, and `Status`, `ConfirmedStatus`,
// `List` and `MayHoldLocks` show them. memlock.go gives the conditions and
// the argument; the write's maxTimeMS is capped at the budget returned.
//
// # FerretDB notes
//
//   - No atomic conditional updates (see Storage), no change streams, no TTL
//     indexes, no `Decimal128` storage (a decimal `_id` is canonicalised
//     correctly but cannot be stored, so locking one fails with
//     `ErrUnavailable` there; MongoDB is fine).
//   - Only an exact `_id` filter is answered from an index; everything else,
//     `$in` included, scans (`TestClaimReadsPushdown`,
//     `TestHeadReadsPushdown`). The store's hot path (acquire, renew,
//     release, status and `Holds` of up to 16 ids) uses only `_id` lookups
//     and inserts: the heads of up to `perKeyReads` (16) keys, and the
//     claims after them, are read one exact `_id` at a time, which beside
//     5,000 head documents is cheaper than one `$in` up to about 30 keys
//     (`BenchmarkHeadReads`); more keys are read with one `$in`.
//     Release-all, the ended-session sweep and the admin list scan.
//     Measured with 1,000-3,900 other records in the lock collection, even
//     an `_id` lookup there took 90 ms instead of 0.4 ms, so on FerretDB
//     every operation slows down with the collection's size: deleting idle
//     keys (`CollectHeads`) is what keeps it small.
//   - Throughput is bounded by SQLite writes (two per change of a key): about
//     1-2 ms per round trip alone, but only a few hundred round trips a second
//     under concurrency (SQLite serializes writers), so the 50 x 200 invariant
//     test is time-bounded. The tests keep SQLite on tmpfs (`/dev/shm`).
//   - `BenchmarkAcquireRelease` (uncontended, one key, cached head: four round
//     trips per cycle) gives about 2.7 ms per acquire+release on this machine;
//     its allocation figures include FerretDB itself, which runs in the test
//     process. `BenchmarkHoldsCached` (the enforcement check for a lock taken
//     through the same proxy) is about 0.6 µs, no round trip.
package lockstore
