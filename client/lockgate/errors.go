package lockgate

import (
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/mongoerr"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/mongo/driver/topology"
)

// Sentinel errors, matched with errors.Is against the *Error a lock command
// returns (docs/ERRORS.md lists the codes).
var (
	// ErrBusy: another session holds a lock (46 LockBusy, reason held or
	// too_many_waiters). Not retried: retry later, or wait with
	// Options.Wait.
	ErrBusy = errors.New("lockgate: lock held by another session")
	// ErrTimeout: Options.Wait elapsed and the lock is still held (24
	// LockTimeout). Nothing was taken.
	ErrTimeout = errors.New("lockgate: timed out waiting for the lock")
	// ErrNotHeld: renew or release of a lock this session does not hold
	// (107 LockFailed, not_holder): it expired, was released or was
	// force-released by an operator.
	ErrNotHeld = errors.New("lockgate: lock not held by this session")
	// ErrUnavailable: the lock store did not answer (46 LockBusy,
	// lockstore_unavailable). Retried by the helper within its budget.
	ErrUnavailable = errors.New("lockgate: lock store unavailable")
	// ErrInvalid: the request was malformed (2 BadValue, 9 FailedToParse,
	// 14 TypeMismatch, 40415 IDLUnknownField).
	ErrInvalid = errors.New("lockgate: invalid lock request")
	// ErrUnauthorized: 13 Unauthorized (a reserved namespace, or an
	// unauthenticated connection where the database requires one).
	ErrUnauthorized = errors.New("lockgate: unauthorized")
	// ErrNotProtected: the server does not know the lock commands (59
	// CommandNotFound): the client is not talking to lockgate, so nothing
	// would enforce the lock.
	ErrNotProtected = errors.New("lockgate: server does not answer lock commands (not connected through lockgate)")
	// ErrLost: the lock was lost while held: a renewal was refused or the
	// lease ended before a renewal could be made.
	ErrLost = errors.New("lockgate: lock lost")
)

// Holder describes who holds a lock, as lockgate shows it (the reply's
// lockgate.holder).
type Holder struct {
	App       string
	Tag       string // the holder tag (holder.tag): a prefix of the keyed owner hash, not the lsid
	Client    string
	User      string
	ExpiresAt time.Time
}

// Error is a lock command's error reply.
type Error struct {
	Command  string
	Code     int32
	CodeName string
	Message  string
	// Reason is lockgate's machine-readable cause (the reply's
	// lockgate.reason), empty when the reply has none.
	Reason string
	NS     string
	IDs    []bson.RawValue
	Holder *Holder
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d %s)", e.Command, e.Message, e.Code, e.CodeName)
}

// Is maps codes and reasons to the sentinel errors.
func (e *Error) Is(target error) bool {
	code := mongoerr.Code(e.Code)
	switch target {
	case ErrBusy:
		return code == mongoerr.LockBusy && (e.Reason == "held" || e.Reason == "too_many_waiters" || e.Reason == "held_by_other")
	case ErrUnavailable:
		return code == mongoerr.LockBusy && e.Reason == "lockstore_unavailable"
	case ErrTimeout:
		return code == mongoerr.LockTimeout
	case ErrNotHeld:
		return code == mongoerr.LockFailed && e.Reason != "in_flight"
	case ErrInvalid:
		return code == mongoerr.BadValue || code == mongoerr.FailedToParse || code == mongoerr.TypeMismatch || code == mongoerr.IDLUnknownField
	case ErrUnauthorized:
		return code == mongoerr.Unauthorized
	case ErrNotProtected:
		return code == mongoerr.CommandNotFound
	}
	return false
}

// fromCommand turns a driver error of a lock command into an *Error when
// the server answered; other errors (network, context) are returned as
// they are.
func fromCommand(cmd string, err error) error {
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.HasErrorLabel("NetworkError") {
		return err
	}
	e := &Error{Command: cmd, Code: ce.Code, CodeName: ce.Name, Message: ce.Message}
	if d, ok := ce.Raw.Lookup("lockgate").DocumentOK(); ok {
		e.Reason, _ = d.Lookup("reason").StringValueOK()
		e.NS, _ = d.Lookup("ns").StringValueOK()
		if arr, ok := d.Lookup("ids").ArrayOK(); ok {
			e.IDs, _ = arr.Values()
		}
		if h, ok := d.Lookup("holder").DocumentOK(); ok {
			hd := &Holder{}
			hd.App, _ = h.Lookup("app").StringValueOK()
			hd.Tag, _ = h.Lookup("tag").StringValueOK()
			hd.Client, _ = h.Lookup("client").StringValueOK()
			hd.User, _ = h.Lookup("user").StringValueOK()
			if ms, ok := h.Lookup("expiresAt").DateTimeOK(); ok {
				hd.ExpiresAt = time.UnixMilli(ms)
			}
			e.Holder = hd
		}
	}
	return e
}

// retryable says whether a lock command may be sent again after err. Lock
// commands are idempotent for the session that sends them (a re-entrant
// acquire keeps its token, a second release frees nothing), so a lost
// reply is safe to retry; a refusal is only retried when the lock store
// itself did not answer, or (renew, release) when earlier requests on the
// proxy connection were still running.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return errors.Is(e, ErrUnavailable) || (mongoerr.Code(e.Code) == mongoerr.LockFailed && e.Reason == "in_flight")
	}
	return mongo.IsNetworkError(err) || mongo.IsTimeout(err) || isServerSelection(err)
}

func isServerSelection(err error) bool {
	var ss topology.ServerSelectionError
	return errors.As(err, &ss)
}
