// Package refuse is how the guard's stages say no: a refusal (Error) and
// the reply a client gets for it, the reasons users match on, and the
// mapping of lock store failures to MongoDB errors. It is its own package,
// below every stage, so that each stage builds refusals the same way
// without reaching into another stage's files; the reply bytes are the
// contract of docs/ERRORS.md.
package refuse

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Reasons, the machine-readable "reason" of a refusal's detail and the
// values of the "reason" metric label. Reasons only one stage gives are
// declared in that stage.
const (
	ReasonBadArgument = "bad_argument"
	ReasonNoSession   = "no_session"
	ReasonHeld        = "held"
	ReasonTimeout     = "timeout"
	ReasonNotHolder   = "not_holder"
	ReasonUnavailable = "lockstore_unavailable"
	ReasonInternal    = "internal"
	ReasonReserved    = "reserved" // the lock store's own namespaces
	// ReasonIntrospection: a command that lists or ends other sessions.
	ReasonIntrospection = "session_introspection"
	// ReasonInFlight: a release or renew could not wait for the requests
	// sent before it on its connection.
	ReasonInFlight = "in_flight"
	// ReasonTooManyWaiters: the lock's wait queue is full.
	ReasonTooManyWaiters = "too_many_waiters"
	// ReasonTooManyLocks: the session holds limits.maxLocksPerSession.
	ReasonTooManyLocks = "too_many_locks"
	// ReasonUnauthenticated: a lock command before authentication, where
	// the upstream requires it.
	ReasonUnauthenticated = "unauthenticated"
	// ReasonUnauthorized: acquireLock without the caller's write privilege
	// on the namespace, lockStatus without its read privilege, where the
	// upstream enforces authorization.
	ReasonUnauthorized = "unauthorized"
	// ReasonNoCollection: acquireLock in a collection that does not exist,
	// under refuseLocksOnMissingCollection.
	ReasonNoCollection = "no_collection"
	// Enforcement's and the schemes': a write whose target cannot be told
	// (ReasonUnclassifiable), a collection-wide write
	// (ReasonCollectionWrite), a filter matching more than maxCandidates
	// (ReasonTooManyCandidates), an insert of a locked _id
	// (ReasonInsertLocked).
	ReasonUnclassifiable    = "unclassifiable"
	ReasonCollectionWrite   = "collection_write"
	ReasonTooManyCandidates = "too_many_candidates"
	ReasonInsertLocked      = "insert_locked"
)

// maxReplyIDs bounds the ids a refusal lists.
const maxReplyIDs = 100

// Error is a refusal on its way to becoming a MongoDB error reply.
type Error struct {
	Code   mongoerr.Code
	Reason string
	Msg    string
	NS     string
	IDs    []docid.ID
	Holder *lockstore.Holder
}

func (e *Error) Error() string { return e.Msg }

// BadArg is a refusal of a malformed argument: nothing was done.
func BadArg(code mongoerr.Code, format string, args ...any) *Error {
	return &Error{Code: code, Reason: ReasonBadArgument, Msg: fmt.Sprintf(format, args...)}
}

// LateReply implements proxy.LateReplier: a refusal made in advance for
// a request that may be too late to leave.
func (e *Error) LateReply() bsoncore.Document { return e.Document() }

// Document renders the error reply body: {ok:0, errmsg, code, codeName,
// lockgate: {reason, ns, ids, holder}}.
func (e *Error) Document() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "reason", e.Reason)
	if e.NS != "" {
		d = bsoncore.AppendStringElement(d, "ns", e.NS)
	}
	if len(e.IDs) > 0 {
		// A refusal of a write naming thousands of ids stays small: the
		// first ones and the count.
		ids := e.IDs[:min(len(e.IDs), maxReplyIDs)]
		aidx, arr := bsoncore.AppendArrayStart(nil)
		for i, id := range ids {
			if id.IsZero() { // a damaged lock record's: no value to show
				arr = bsoncore.AppendNullElement(arr, strconv.Itoa(i))
				continue
			}
			arr = bsoncore.AppendValueElement(arr, strconv.Itoa(i), id.Core())
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
		d = bsoncore.AppendArrayElement(d, "ids", arr)
		if len(ids) < len(e.IDs) {
			d = bsoncore.AppendInt32Element(d, "idsTotal", int32(len(e.IDs)))
		}
	}
	if e.Holder != nil {
		d = bsoncore.AppendDocumentElement(d, "holder", HolderDocument(*e.Holder))
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return (&mongoerr.Error{Code: e.Code, Msg: e.Msg}).Document(bsoncore.AppendDocumentElement(nil, "lockgate", d))
}

// HolderDocument is a lock's holder as refusals, lockStatus and the
// acquire reply show it: {app, tag, client, user, expiresAt}. tag is the
// holder tag (a prefix of the keyed owner hash); "session" is reserved
// for the caller's own lsid prefix (docs/LOCKS.md, "Two ids"), and no
// holder document carries one. An implicit lock's holder is marked so,
// with its command: the proxy holds it for a writer that holds no lock,
// for one command.
func HolderDocument(h lockstore.Holder) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "app", h.App)
	d = bsoncore.AppendStringElement(d, "tag", h.SessionPrefix)
	if h.Client != "" {
		d = bsoncore.AppendStringElement(d, "client", h.Client)
	}
	if h.User != "" {
		d = bsoncore.AppendStringElement(d, "user", h.User)
	}
	d = bsoncore.AppendDateTimeElement(d, "expiresAt", h.ExpiresAt.UnixMilli())
	if h.Implicit != "" {
		d = bsoncore.AppendBooleanElement(d, "implicit", true)
		d = bsoncore.AppendStringElement(d, "command", h.Implicit)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// FromStore maps a lock store error to the reply a client gets. This is
// the one place where lock store failures become MongoDB error codes.
// shown says whether the caller may see other holders
// (authority.MayDisclose): without it a busy lock names no holder and a lock this
// session does not hold says nothing of what became of it.
func FromStore(op, ns string, err error, shown bool) *Error {
	var held *lockstore.HeldError
	var notHolder *lockstore.NotHolderError
	switch {
	case errors.As(err, &held):
		e := &Error{NS: ns, IDs: []docid.ID{held.ID}}
		who := HeldByAnother
		if shown {
			e.Holder, who = &held.Holder, DescribeHolder(held.Holder)
		}
		if held.Timeout {
			e.Code, e.Reason = mongoerr.LockTimeout, ReasonTimeout
			e.Msg = fmt.Sprintf("lockgate: timed out waiting for the lock on %s _id %s: %s; no lock was taken: retry, or wait longer with a larger waitMS",
				ns, held.ID.String(), who)
		} else {
			e.Code, e.Reason = mongoerr.LockBusy, ReasonHeld
			e.Msg = fmt.Sprintf("lockgate: the lock on %s _id %s is %s; no lock was taken: retry later, or pass waitMS to wait for it",
				ns, held.ID.String(), who)
		}
		return e
	case errors.As(err, &notHolder):
		why := "it expired, was released, or was never taken"
		if shown && len(notHolder.Why) > 0 && notHolder.Why[0] != "" {
			why = notHolder.Why[0]
			if len(notHolder.IDs) > 1 {
				why = fmt.Sprintf("_id %s: %s", notHolder.IDs[0].String(), why)
			}
		}
		return &Error{Code: mongoerr.LockFailed, Reason: ReasonNotHolder, NS: ns, IDs: notHolder.IDs,
			Msg: fmt.Sprintf("lockgate: %s: this session does not hold the lock on %s (%s); acquire it again with acquireLock", op, IDsString(notHolder.IDs), why)}
	case errors.Is(err, lockstore.ErrUnavailable), errors.Is(err, lockstore.ErrClosed):
		return &Error{Code: mongoerr.LockBusy, Reason: ReasonUnavailable, NS: ns,
			Msg: fmt.Sprintf("lockgate: %s failed: the lock store is unreachable (%v); nothing was changed: retry when it is back", op, err)}
	case errors.Is(err, lockstore.ErrTooManyWaiters):
		return &Error{Code: mongoerr.LockBusy, Reason: ReasonTooManyWaiters, NS: ns,
			Msg: fmt.Sprintf("lockgate: %s: %v; nothing was taken", op, err)}
	case errors.Is(err, lockstore.ErrTooManyLocks):
		return &Error{Code: mongoerr.LockBusy, Reason: ReasonTooManyLocks, NS: ns,
			Msg: fmt.Sprintf("lockgate: %s: %v (limits.maxLocksPerSession); nothing was taken", op, err)}
	case errors.Is(err, lockstore.ErrInvalidID), errors.Is(err, lockstore.ErrInvalidLease), errors.Is(err, lockstore.ErrInvalidArgument):
		return &Error{Code: mongoerr.BadValue, Reason: ReasonBadArgument, NS: ns, Msg: fmt.Sprintf("lockgate: %s: %v", op, err)}
	default:
		return &Error{Code: mongoerr.LockBusy, Reason: ReasonInternal, NS: ns,
			Msg: fmt.Sprintf("lockgate: %s failed: %v; nothing was changed", op, err)}
	}
}

// HeldByAnother is what a refusal says of a lock's holder to a caller who
// may not see it (authority.MayDisclose).
const HeldByAnother = "held by another session"

// OwnAppAdvice replaces "wait for the holder" when the holder is the
// caller's own application (README, "The implicit-session trap"): a lock
// taken in one pooled implicit session and a write sent in another. Waiting
// would wait for oneself.
const OwnAppAdvice = "your own application holds this lock in another session (the implicit-session trap): " +
	"lock and write in one explicit session (startSession), passing it to acquireLock and to every write; do not wait for it"

// OwnApplication reports whether holder h is the caller's own application
// in another session: the same application name, from the same host, and
// the same user where there are users. A client address carries the port
// of one pooled connection, so hosts are compared without it.
func OwnApplication(c *proxy.ClientInfo, h lockstore.Holder) bool {
	if h.App == "" || h.App != c.AppName() || h.User != c.User() {
		return false
	}
	return hostOf(h.Client) != "" && hostOf(h.Client) == hostOf(c.Addr)
}

func hostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// DescribeHolder is a lock's holder in a refusal's message, for a caller
// who may see it.
func DescribeHolder(h lockstore.Holder) string {
	app := "an unnamed application"
	if h.App != "" {
		app = fmt.Sprintf("application %q", h.App)
	}
	return fmt.Sprintf("held by %s, holder tag %s, %s", app, h.SessionPrefix, leaseEnd(h.ExpiresAt))
}

// leaseEnd says when a lease ends, never printing the zero or 1970 time
// that an absent or released lease carries.
func leaseEnd(t time.Time) string {
	if t.IsZero() || t.Before(time.Unix(86400, 0)) {
		return "with no lease in force (it ended or was released)"
	}
	return "until " + t.UTC().Format(time.RFC3339Nano)
}

// IDsString is a refusal message's list of ids: "_id 1, 2", the first ten
// and the count of a longer list.
func IDsString(ids []docid.ID) string {
	s := "_id "
	for i, id := range ids {
		if i > 0 {
			s += ", "
		}
		if i == 10 {
			s += fmt.Sprintf("... (%d in all)", len(ids))
			break
		}
		s += id.String()
	}
	return s
}
