package lockstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// Sentinel errors. Test with errors.Is; the proxy maps them to MongoDB error
// codes in one place (ErrBusy -> 46 LockBusy, ErrTimeout -> 24 LockTimeout).
var (
	// ErrBusy: a lock is held by another owner and the call did not wait.
	// Returned as a *HeldError that names the holder.
	ErrBusy = errors.New("lock is held by another session")
	// ErrTimeout: the wait elapsed before every lock could be taken.
	// Returned as a *HeldError that names the last holder seen.
	ErrTimeout = errors.New("timed out waiting for the lock")
	// ErrNotHolder: renew of a lock the owner does not hold (or whose lease
	// has ended). Returned as a *NotHolderError listing the ids.
	ErrNotHolder = errors.New("lock not held by this session")
	// ErrUnavailable: the lock store could not be reached or refused the
	// operation; the cause is wrapped. Callers enforcing locks must fail
	// closed on it.
	ErrUnavailable = errors.New("lock store unavailable")
	// ErrInvalidID: a value that cannot be a document _id (array, regex,
	// undefined, "$"-prefixed field, malformed BSON): docid.ErrInvalid,
	// which is where ids are validated.
	ErrInvalidID = docid.ErrInvalid
	// ErrInvalidLease: a negative lease or one over Config.MaxLease.
	ErrInvalidLease = errors.New("invalid lease")
	// ErrInvalidArgument: any other bad argument: no owner session, empty
	// namespace, no ids, negative wait.
	ErrInvalidArgument = errors.New("invalid lock argument")
	// ErrClosed: the Store has been closed.
	ErrClosed = errors.New("lock store closed")
	// ErrTooManyWaiters: a lock already has Config.MaxWaiters waiting
	// for it on this instance; the caller may retry or fail fast.
	ErrTooManyWaiters = errors.New("too many waiters for the lock")
	// ErrTooManyLocks: the acquire would leave the session holding more
	// than Config.MaxLocksPerSession locks through this instance.
	ErrTooManyLocks = errors.New("too many locks held by the session")
	// ErrHeldInMemory: ForceRelease found the key held in memory for a
	// legacy write (memlock.go) and its context ended before that lock
	// did. Returned as a *MemoryHeldError that says when it ends.
	ErrHeldInMemory = errors.New("lock held in memory for a write that may still land")
	// ErrChangedHands: ForceReleaseOf found the key no longer held under
	// the token named. Returned as a *ChangedHandsError.
	ErrChangedHands = errors.New("the lock changed hands")
)

// Holder describes who holds a lock, for error messages and status views.
// It never carries the full session id.
type Holder struct {
	App           string    // client application name, "" if unknown
	Client        string    // client address, "" if unknown
	User          string    // authenticated user@db, "" without authentication
	SessionPrefix string    // first 4 bytes of the owner key, hex: a tag, not the session id
	ExpiresAt     time.Time // lease end, in the store's estimate of server time
	Token         int64     // fencing token of the current holder
	// Implicit is the command of a writer that holds no lock, for which
	// the proxy holds this one while its write runs; "" for acquireLock's.
	Implicit string
}

// HeldError reports that a lock is held by someone else. errors.Is matches
// ErrBusy, or ErrTimeout when Timeout is set.
type HeldError struct {
	NS      namespace.Namespace
	ID      docid.ID
	Holder  Holder
	Timeout bool
}

func (e *HeldError) Error() string {
	var b strings.Builder
	if e.Timeout {
		b.WriteString("timed out waiting for lock on ")
	} else {
		b.WriteString("lock on ")
	}
	fmt.Fprintf(&b, "%s _id %s held by ", e.NS, e.ID)
	if e.Holder.App != "" {
		fmt.Fprintf(&b, "app %q ", e.Holder.App)
	} else {
		b.WriteString("an unnamed app ")
	}
	fmt.Fprintf(&b, "holder tag %s", e.Holder.SessionPrefix)
	// A timeout behind other waiters may find the lock free by now:
	// never print the zero or 1970 time of an absent lease.
	if t := e.Holder.ExpiresAt; !t.IsZero() && !t.Before(time.Unix(86400, 0)) {
		fmt.Fprintf(&b, " until %s", t.UTC().Format(time.RFC3339Nano))
	} else {
		b.WriteString(" with no lease in force")
	}
	return b.String()
}

// Is makes errors.Is(err, ErrBusy) or errors.Is(err, ErrTimeout) true.
func (e *HeldError) Is(target error) bool {
	if e.Timeout {
		return target == ErrTimeout
	}
	return target == ErrBusy
}

// MemoryHeldError reports a force-release that gave up waiting for a
// memory lock: it has no fencing token, so ending it before its write is
// answered would let that write land inside the next holder's work.
// errors.Is matches ErrHeldInMemory.
type MemoryHeldError struct {
	NS     namespace.Namespace
	ID     docid.ID
	Holder Holder // ExpiresAt: by when its write has surely ended
}

func (e *MemoryHeldError) Error() string {
	app := "an unnamed app"
	if e.Holder.App != "" {
		app = fmt.Sprintf("app %q", e.Holder.App)
	}
	return fmt.Sprintf("the lock on %s _id %s is held in lockgate's memory for one %s of %s (holder tag %s), a write that holds no lock; "+
		"it has no fencing token, so it ends only when that write is answered, at the latest at %s; nothing was released: retry then if it is still listed",
		e.NS, e.ID, e.Holder.Implicit, app, e.Holder.SessionPrefix, e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeldInMemory) true.
func (e *MemoryHeldError) Is(target error) bool { return target == ErrHeldInMemory }

// ChangedHandsError reports a force-release of a holding that is not the
// key's current one: Now is the key's state (Held false when it is free).
// errors.Is matches ErrChangedHands.
type ChangedHandsError struct {
	NS   namespace.Namespace
	ID   docid.ID
	Want int64
	Now  Status
}

func (e *ChangedHandsError) Error() string {
	now := "it is free now"
	if e.Now.Held {
		app := "an unnamed app"
		if e.Now.Holder.App != "" {
			app = fmt.Sprintf("app %q", e.Now.Holder.App)
		}
		now = fmt.Sprintf("it is held now by %s (holder tag %s) with token %d", app, e.Now.Holder.SessionPrefix, e.Now.Token)
	}
	return fmt.Sprintf("the lock on %s _id %s is no longer the one with token %d: %s; nothing was released: look again, and release the lock you see", e.NS, e.ID, e.Want, now)
}

// Is makes errors.Is(err, ErrChangedHands) true.
func (e *ChangedHandsError) Is(target error) bool { return target == ErrChangedHands }

// NotHolderError lists the ids that the owner does not hold. errors.Is
// matches ErrNotHolder.
type NotHolderError struct {
	NS  namespace.Namespace
	IDs []docid.ID
	// Why says, per id where known, what happened to the lock: "an
	// operator force-released it (reason: ...)", "its lease ended at
	// ...", "another session holds it now", "it was never taken".
	Why []string
}

func (e *NotHolderError) Error() string {
	ids := make([]string, len(e.IDs))
	for i, id := range e.IDs {
		ids[i] = id.String()
	}
	return fmt.Sprintf("%v: %s _id %s", ErrNotHolder, e.NS, strings.Join(ids, ", "))
}

// Is makes errors.Is(err, ErrNotHolder) true.
func (e *NotHolderError) Is(target error) bool { return target == ErrNotHolder }

func unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// FormatMS prints a duration as the lock commands take it, in whole
// milliseconds ("600000 ms"): a user who sent leaseMS: 1000000000 should
// read that number back, not "277h46m40s".
func FormatMS(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + " ms" }

// SessionPrefix is the short form of a session id shown to other sessions
// and in logs: the first 4 bytes in hex.
func SessionPrefix(session []byte) string {
	if len(session) > 4 {
		session = session[:4]
	}
	return hex.EncodeToString(session)
}
