package guard

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Reasons, the machine-readable "reason" of a refusal's detail and the
// values of the "reason" metric label.
const (
	reasonBadArgument = "bad_argument"
	reasonNoSession   = "no_session"
	reasonHeld        = "held"
	reasonTimeout     = "timeout"
	reasonNotHolder   = "not_holder"
	reasonUnavailable = "lockstore_unavailable"
	reasonInternal    = "internal"
	reasonReserved    = "reserved" // the lock store's own namespaces
	// reasonIntrospection: a command that lists or ends other sessions.
	reasonIntrospection = "session_introspection"
	// reasonInFlight: a release or renew could not wait for the requests
	// sent before it on its connection.
	reasonInFlight = "in_flight"
	// reasonTooManyWaiters: the lock's wait queue is full.
	reasonTooManyWaiters = "too_many_waiters"
	// reasonTooManyLocks: the session holds limits.maxLocksPerSession.
	reasonTooManyLocks = "too_many_locks"
	// reasonUnauthenticated: a lock command before authentication, where
	// the upstream requires it.
	reasonUnauthenticated = "unauthenticated"
	// reasonUnauthorized: acquireLock without the caller's write privilege
	// on the namespace, lockStatus without its read privilege, where the
	// upstream enforces authorization.
	reasonUnauthorized = "unauthorized"
	// reasonNoCollection: acquireLock in a collection that does not exist,
	// under refuseLocksOnMissingCollection.
	reasonNoCollection = "no_collection"
)

// maxReplyIDs bounds the ids a refusal lists.
const maxReplyIDs = 100

// cmdError is a refusal on its way to becoming a MongoDB error reply.
type cmdError struct {
	code   mongoerr.Code
	reason string
	msg    string
	ns     string
	ids    []docid.ID
	holder *lockstore.Holder
}

func (e *cmdError) Error() string { return e.msg }

func badArg(code mongoerr.Code, format string, args ...any) *cmdError {
	return &cmdError{code: code, reason: reasonBadArgument, msg: fmt.Sprintf(format, args...)}
}

// document renders the error reply body: {ok:0, errmsg, code, codeName,
// lockgate: {reason, ns, ids, holder}}.
// LateReply implements proxy.LateReplier: a refusal made in advance for
// a request that may be too late to leave.
func (e *cmdError) LateReply() bsoncore.Document { return e.document() }

func (e *cmdError) document() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "reason", e.reason)
	if e.ns != "" {
		d = bsoncore.AppendStringElement(d, "ns", e.ns)
	}
	if len(e.ids) > 0 {
		// A refusal of a write naming thousands of ids stays small: the
		// first ones and the count.
		ids := e.ids[:min(len(e.ids), maxReplyIDs)]
		aidx, arr := bsoncore.AppendArrayStart(nil)
		for i, id := range ids {
			if id.IsZero() { // a damaged lock record's: no value to show
				arr = bsoncore.AppendNullElement(arr, arrayKey(i))
				continue
			}
			arr = bsoncore.AppendValueElement(arr, arrayKey(i), id.Core())
		}
		arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
		d = bsoncore.AppendArrayElement(d, "ids", arr)
		if len(ids) < len(e.ids) {
			d = bsoncore.AppendInt32Element(d, "idsTotal", int32(len(e.ids)))
		}
	}
	if e.holder != nil {
		d = bsoncore.AppendDocumentElement(d, "holder", holderDocument(*e.holder))
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return (&mongoerr.Error{Code: e.code, Msg: e.msg}).Document(bsoncore.AppendDocumentElement(nil, "lockgate", d))
}

// holderDocument is a lock's holder as refusals, lockStatus and the
// acquire reply show it: {app, tag, client, user, expiresAt}. tag is the
// holder tag (a prefix of the keyed owner hash); "session" is reserved
// for the caller's own lsid prefix (docs/LOCKS.md, "Two ids"), and no
// holder document carries one.
func holderDocument(h lockstore.Holder) bsoncore.Document {
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
	d = appendImplicit(d, h)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// fromStore maps a lock store error to the reply a client gets. This is
// the one place where lock store failures become MongoDB error codes.
// shown says whether the caller may see other holders (Guard.mayDisclose):
// without it a busy lock names no holder and a lock this session does not
// hold says nothing of what became of it.
func fromStore(op, ns string, err error, shown bool) *cmdError {
	var held *lockstore.HeldError
	var notHolder *lockstore.NotHolderError
	switch {
	case errors.As(err, &held):
		e := &cmdError{ns: ns, ids: []docid.ID{held.ID}}
		who := heldByAnother
		if shown {
			e.holder, who = &held.Holder, describeHolder(held.Holder)
		}
		if held.Timeout {
			e.code, e.reason = mongoerr.LockTimeout, reasonTimeout
			e.msg = fmt.Sprintf("lockgate: timed out waiting for the lock on %s _id %s: %s; no lock was taken: retry, or wait longer with a larger waitMS",
				ns, held.ID.String(), who)
		} else {
			e.code, e.reason = mongoerr.LockBusy, reasonHeld
			e.msg = fmt.Sprintf("lockgate: the lock on %s _id %s is %s; no lock was taken: retry later, or pass waitMS to wait for it",
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
		return &cmdError{code: mongoerr.LockFailed, reason: reasonNotHolder, ns: ns, ids: notHolder.IDs,
			msg: fmt.Sprintf("lockgate: %s: this session does not hold the lock on %s (%s); acquire it again with acquireLock", op, idsString(notHolder.IDs), why)}
	case errors.Is(err, lockstore.ErrUnavailable), errors.Is(err, lockstore.ErrClosed):
		return &cmdError{code: mongoerr.LockBusy, reason: reasonUnavailable, ns: ns,
			msg: fmt.Sprintf("lockgate: %s failed: the lock store is unreachable (%v); nothing was changed: retry when it is back", op, err)}
	case errors.Is(err, lockstore.ErrTooManyWaiters):
		return &cmdError{code: mongoerr.LockBusy, reason: reasonTooManyWaiters, ns: ns,
			msg: fmt.Sprintf("lockgate: %s: %v; nothing was taken", op, err)}
	case errors.Is(err, lockstore.ErrTooManyLocks):
		return &cmdError{code: mongoerr.LockBusy, reason: reasonTooManyLocks, ns: ns,
			msg: fmt.Sprintf("lockgate: %s: %v (limits.maxLocksPerSession); nothing was taken", op, err)}
	case errors.Is(err, lockstore.ErrInvalidID), errors.Is(err, lockstore.ErrInvalidLease), errors.Is(err, lockstore.ErrInvalidArgument):
		return &cmdError{code: mongoerr.BadValue, reason: reasonBadArgument, ns: ns, msg: fmt.Sprintf("lockgate: %s: %v", op, err)}
	default:
		return &cmdError{code: mongoerr.LockBusy, reason: reasonInternal, ns: ns,
			msg: fmt.Sprintf("lockgate: %s failed: %v; nothing was changed", op, err)}
	}
}

// heldByAnother is what a refusal says of a lock's holder to a caller who
// may not see it (Guard.mayDisclose).
const heldByAnother = "held by another session"

// ownAppAdvice replaces "wait for the holder" when the holder is the
// caller's own application (README, "The implicit-session trap"): a lock
// taken in one pooled implicit session and a write sent in another. Waiting
// would wait for oneself.
const ownAppAdvice = "your own application holds this lock in another session (the implicit-session trap): " +
	"lock and write in one explicit session (startSession), passing it to acquireLock and to every write; do not wait for it"

// ownApplication reports whether holder h is the caller's own application
// in another session: the same application name, from the same host, and
// the same user where there are users. A client address carries the port
// of one pooled connection, so hosts are compared without it.
func ownApplication(c *proxy.ClientInfo, h lockstore.Holder) bool {
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

func describeHolder(h lockstore.Holder) string {
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

func idsString(ids []docid.ID) string {
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

func arrayKey(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return fmt.Sprint(i)
}
