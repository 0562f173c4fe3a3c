package lockcmd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// releaseAllCost is what a releaseLock without ids counts against its
// connection's share (throttle.go): it queries the lock collection by
// owner, which servers without an index for it (FerretDB) answer by
// scanning every record.
const releaseAllCost = 200

// genericFields are the arguments drivers attach to every command; a lock
// command accepts and ignores them.
var genericFields = map[string]bool{
	"$db": true, "lsid": true, "$clusterTime": true, "$readPreference": true,
	"apiVersion": true, "apiStrict": true, "apiDeprecationErrors": true,
	"comment": true, "maxTimeMS": true, "txnNumber": true, "autocommit": true,
	"startTransaction": true, "readConcern": true, "writeConcern": true,
}

// lockArgs are the parsed arguments of a lock command.
type lockArgs struct {
	name    string
	op      wire.LockOp
	ns      namespace.Namespace
	coll    string     // the collection as given, for hints
	ids     []docid.ID // copies: they outlive the request's buffer
	hasIDs  bool
	lease   time.Duration
	wait    time.Duration
	errText string
	bind    string
}

func parseLockCommand(cmd *wire.Command, maxIDs int) (*lockArgs, *refuse.Error) {
	spec := cmd.Spec()
	a := &lockArgs{name: cmd.Name, op: spec.Lock}
	elems, err := cmd.Body.Elements()
	if err != nil {
		return nil, refuse.BadArg(mongoerr.FailedToParse, "%s: %v", cmd.Name, err)
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok {
		return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: the value of %s must be the collection name as a string, got %s", cmd.Name, cmd.Name, elems[0].Value().Type)
	}
	if coll == "" || strings.HasPrefix(coll, "$") || strings.ContainsRune(coll, 0) {
		return nil, refuse.BadArg(mongoerr.BadValue, "%s: invalid collection name %q", cmd.Name, coll)
	}
	if !namespace.ValidDatabase(cmd.DB) {
		return nil, refuse.BadArg(mongoerr.InvalidNamespace, "%s: invalid database name %q", cmd.Name, cmd.DB)
	}
	a.ns, a.coll = namespace.New(cmd.DB, coll), coll
	for _, e := range elems[1:] {
		key := e.Key()
		if genericFields[key] {
			continue
		}
		if !slices.Contains(spec.Args, key) {
			return nil, refuse.BadArg(mongoerr.IDLUnknownField, "%s: unknown field %q (allowed: %s)", cmd.Name, key, strings.Join(spec.Args, ", "))
		}
		v := e.Value()
		switch key {
		case "ids":
			arr, ok := v.ArrayOK()
			if !ok {
				return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: ids must be an array of _id values, got %s", cmd.Name, v.Type)
			}
			vals, err := arr.Values()
			if err != nil {
				return nil, refuse.BadArg(mongoerr.FailedToParse, "%s: ids: %v", cmd.Name, err)
			}
			if len(vals) == 0 {
				return nil, refuse.BadArg(mongoerr.BadValue, "%s: ids is empty: name at least one _id", cmd.Name)
			}
			if len(vals) > maxIDs {
				return nil, refuse.BadArg(mongoerr.BadValue, "%s: %d ids, at most %d per command (limits.maxLockIDs): lock in smaller batches", cmd.Name, len(vals), maxIDs)
			}
			a.hasIDs = true
			// Copies: they outlive the request's buffer.
			if a.ids, err = docid.Copy(vals); err != nil {
				return nil, refuse.BadArg(mongoerr.BadValue, "%s: ids: %v", cmd.Name, err)
			}
		case "leaseMS", "waitMS":
			ms, ok := wire.Integral(v)
			if !ok {
				return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: %s must be a whole number of milliseconds, got %s", cmd.Name, key, docid.Format(bson.RawValue{Type: v.Type, Value: v.Data}))
			}
			if ms < 0 {
				return nil, refuse.BadArg(mongoerr.BadValue, "%s: %s must not be negative, got %d", cmd.Name, key, ms)
			}
			if key == "leaseMS" {
				if ms == 0 {
					return nil, refuse.BadArg(mongoerr.BadValue, "%s: leaseMS must be positive; omit it for the default lease", cmd.Name)
				}
				a.lease = time.Duration(ms) * time.Millisecond
			} else {
				a.wait = time.Duration(ms) * time.Millisecond
			}
		case "error":
			s, ok := v.StringValueOK()
			if !ok {
				return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: error must be a string, got %s", cmd.Name, v.Type)
			}
			if len(s) > 1024 {
				s = s[:1024]
			}
			a.errText = s
		case "bind":
			s, ok := v.StringValueOK()
			if !ok {
				return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: bind must be a string, got %s", cmd.Name, v.Type)
			}
			if s == "" || len(s) > 256 {
				return nil, refuse.BadArg(mongoerr.BadValue, "%s: bind must be a non-empty string of at most 256 bytes", cmd.Name)
			}
			a.bind = s
		}
	}
	if !a.hasIDs && a.op != wire.LockRelease {
		return nil, refuse.BadArg(mongoerr.BadValue, "%s: missing ids: name the _id values to lock, e.g. {%s: %q, ids: [1, 2]}", cmd.Name, cmd.Name, coll)
	}
	return a, nil
}

// Stage answers the lock commands (acquireLock, releaseLock, renewLock,
// lockStatus) itself; they never reach the upstream. It is a proxy.Stage.
type Stage struct{ cfg Config }

// New returns the stage.
func New(cfg Config) *Stage {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Stage{cfg: cfg}
}

// Decide implements proxy.Stage.
func (s *Stage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	if req.Command == nil || req.Command.Role() != wire.RoleLock {
		return proxy.Decision{}, false
	}
	return proxy.Decision{Action: proxy.Reply, Reply: s.lockCommand(ctx, req)}, true
}

// lockCommand runs one lock command and returns the reply body.
func (s *Stage) lockCommand(ctx context.Context, req *proxy.Request) bsoncore.Document {
	cmd := req.Command
	start := time.Now()
	a, cerr := parseLockCommand(cmd, s.cfg.MaxLockIDs)
	if pol := s.cfg.Policy(); cerr == nil && pol != nil {
		// A lock under a case variant of a protected database is no lock
		// on the documents an upstream that folds database names writes
		// under it (policy.Lookup).
		if spelled, ok := pol.CaseVariantOf(cmd.DB); ok {
			cerr = refuse.BadArg(mongoerr.InvalidNamespace, "%s: database %q differs only in case from %q, which the policy protects; send the command on %q", cmd.Name, cmd.DB, spelled, spelled)
		}
	}
	// One connection's lock commands cannot take the lock store from the
	// others: they wait for their ids' share, and for a delay once they
	// keep being malformed (throttle.go).
	nids := 1
	if a != nil {
		nids = len(a.ids)
		if a.op == wire.LockRelease && !a.hasIDs {
			nids = releaseAllCost
		}
	}
	if !s.cfg.Admit(ctx, req.Client, nids) {
		return (&refuse.Error{Code: mongoerr.LockBusy, Reason: refuse.ReasonInternal, Msg: "lockgate: " + cmd.Name + ": the connection closed"}).Document()
	}
	defer func() {
		s.cfg.Done(req.Client, cerr != nil && cerr.Reason == refuse.ReasonBadArgument)
	}()
	var session []byte
	if cerr == nil {
		session, cerr = s.lockCommandMayRun(ctx, req, a)
	}
	if cerr == nil {
		var reply bsoncore.Document
		if reply, cerr = s.runLockCommand(ctx, req, a, s.cfg.Owner(req, session, a.bind), session); cerr == nil {
			s.cfg.Observe(cmd.Name, "ok", time.Since(start))
			return withWarnings(reply, s.namespaceHints(ctx, cmd, a))
		}
	}
	s.cfg.Observe(cmd.Name, cerr.Reason, time.Since(start))
	if a != nil && cerr.NS == "" {
		cerr.NS = a.ns.String()
	}
	s.cfg.Log.Debug("lock command refused", zap.String("command", cmd.Name), zap.Uint64("conn", req.Client.ID),
		zap.String("reason", cerr.Reason), zap.String("error", cerr.Msg))
	return cerr.Document()
}

// lockCommandMayRun checks, in order, what a lock command needs before it
// touches the lock store: an authenticated caller where the upstream
// requires one, a logical session, the caller's own write privilege for
// acquireLock, and its turn on the connection for releases and renewals.
// It returns the session id.
func (s *Stage) lockCommandMayRun(ctx context.Context, req *proxy.Request, a *lockArgs) ([]byte, *refuse.Error) {
	cmd := req.Command
	if req.Client.User() == "" && s.cfg.Authority.Required() {
		return nil, &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonUnauthenticated,
			Msg: "lockgate: " + cmd.Name + " refused: the database requires authentication and this connection has not authenticated; " +
				"lock commands carry the caller's own authority, so authenticate first"}
	}
	session, ok := cmd.SessionID()
	if !ok && cmd.Body.Lookup("lsid").Type != 0 {
		// Present but not {id: <UUID>}: the server's TypeMismatch.
		return nil, refuse.BadArg(mongoerr.TypeMismatch, "%s: lsid must be a document {id: <UUID>}, got %s", cmd.Name, describeLSID(cmd.Body.Lookup("lsid")))
	}
	if !ok {
		return nil, &refuse.Error{Code: mongoerr.BadValue, Reason: refuse.ReasonNoSession,
			Msg: "lockgate: " + cmd.Name + " needs a logical session: run it in an explicit session (startSession) and pass the same session to your writes"}
	}
	if e := s.mayLock(ctx, req, a); e != nil {
		return nil, e
	}
	if e := s.refuseMissingCollection(ctx, a); e != nil {
		return nil, e
	}
	if e := s.inOrder(ctx, req); e != nil {
		return nil, e
	}
	return session, nil
}

func (s *Stage) runLockCommand(ctx context.Context, req *proxy.Request, a *lockArgs, o lockstore.Owner, lsid []byte) (bsoncore.Document, *refuse.Error) {
	switch a.op {
	case wire.LockAcquire:
		wait := a.wait
		if wait > s.cfg.MaxWait {
			return nil, refuse.BadArg(mongoerr.BadValue, "acquireLock: waitMS %d is over the limit of %d", wait.Milliseconds(), s.cfg.MaxWait.Milliseconds())
		}
		actx := ctx
		if s.cfg.FenceFloors != nil {
			if floors := s.cfg.FenceFloors(ctx, a.ns, a.ids); floors != nil {
				actx = lockstore.WithTokenFloors(ctx, floors)
			}
		}
		locks, err := s.cfg.Store.Acquire(actx, o, a.ns, a.ids, a.lease, wait)
		if err != nil {
			return nil, s.storeError(ctx, req, a, err)
		}
		if e := s.cfg.Fence(ctx, a.ns, o, locks); e != nil {
			return nil, e
		}
		return locksReply(locks, lsid, o), nil
	case wire.LockRenew:
		locks, err := s.cfg.Store.Renew(ctx, o, a.ns, a.ids, a.lease)
		if err != nil {
			return nil, s.storeError(ctx, req, a, err)
		}
		return locksReply(locks, lsid, o), nil
	case wire.LockRelease:
		var n int
		var err error
		if a.hasIDs {
			n, err = s.cfg.Store.Release(ctx, o, a.ns, a.ids, a.errText)
		} else {
			n, err = s.cfg.Store.ReleaseAll(ctx, o, a.ns, a.errText)
		}
		if err != nil {
			return nil, s.storeError(ctx, req, a, err)
		}
		idx, d := bsoncore.AppendDocumentStart(nil)
		d = bsoncore.AppendDoubleElement(d, "ok", 1)
		d = bsoncore.AppendInt32Element(d, "released", int32(n))
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		return d, nil
	default: // lockStatus
		sts, err := s.cfg.Store.Status(ctx, o, a.ns, a.ids)
		if err != nil {
			return nil, s.storeError(ctx, req, a, err)
		}
		return statusReply(sts), nil
	}
}

// storeError is fromStore for a lock command of req's caller. Whether the
// caller may see other holders is asked only on this refusal path, and for
// every lock this session does not hold alike, so that the question itself
// tells nothing.
func (s *Stage) storeError(ctx context.Context, req *proxy.Request, a *lockArgs, err error) *refuse.Error {
	var held *lockstore.HeldError
	var notHolder *lockstore.NotHolderError
	shown := true
	if errors.As(err, &held) || errors.As(err, &notHolder) {
		shown = s.cfg.Authority.MayDisclose(ctx, req, a.ns)
	}
	e := refuse.FromStore(a.name, a.ns.String(), err, shown)
	if held != nil && shown && !held.Timeout && refuse.OwnApplication(req.Client, held.Holder) {
		e.Msg = fmt.Sprintf("lockgate: the lock on %s _id %s is %s; no lock was taken: %s", a.ns, held.ID.String(), refuse.DescribeHolder(held.Holder), refuse.OwnAppAdvice)
	}
	return e
}

// sessionNote reminds the caller which session now holds the locks. Nothing
// on the wire tells a driver's explicit session from an implicit one (both
// send a bare lsid), so a lock taken without startSession lands in a pooled
// implicit session that a later write may or may not reuse; the note and
// the session prefix make that visible in the reply (docs/LOCKS.md).
const sessionNote = "held by logical session %s: write in the same explicit session (startSession) and pass it to every write; a write outside it is refused"

// locksReply is the reply of acquireLock and renewLock. session is the
// caller's own lsid, and the reply's "session" its prefix: that prefix
// tells the caller nothing about others. "holder" is the caller as every
// other view shows this holder (refusals, lockStatus, /locks, the
// console, the audit trail): its application, client, user and holder
// tag, the prefix of the keyed owner hash. The two ids differ on purpose
// (the stored owner is never the lsid), so each has one name everywhere.
func locksReply(locks []lockstore.Lock, session []byte, owner lockstore.Owner) bsoncore.Document {
	aidx, arr := bsoncore.AppendArrayStart(nil)
	for i, l := range locks {
		idx, d := bsoncore.AppendDocumentStart(nil)
		d = bsoncore.AppendValueElement(d, "_id", l.ID.Core())
		d = bsoncore.AppendInt64Element(d, "token", l.Token)
		d = bsoncore.AppendDateTimeElement(d, "expiresAt", l.ExpiresAt.UnixMilli())
		if l.LastError != "" {
			d = bsoncore.AppendStringElement(d, "lastError", l.LastError)
		}
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		arr = bsoncore.AppendDocumentElement(arr, arrayKey(i), d)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	hidx, h := bsoncore.AppendDocumentStart(nil)
	h = bsoncore.AppendStringElement(h, "app", owner.App)
	h = bsoncore.AppendStringElement(h, "tag", lockstore.SessionPrefix(owner.Session))
	if owner.Client != "" {
		h = bsoncore.AppendStringElement(h, "client", owner.Client)
	}
	if owner.User != "" {
		h = bsoncore.AppendStringElement(h, "user", owner.User)
	}
	h, _ = bsoncore.AppendDocumentEnd(h, hidx)
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d = bsoncore.AppendArrayElement(d, "locks", arr)
	prefix := lockstore.SessionPrefix(session)
	d = bsoncore.AppendStringElement(d, "session", prefix)
	d = bsoncore.AppendDocumentElement(d, "holder", h)
	d = bsoncore.AppendStringElement(d, "note", fmt.Sprintf(sessionNote, prefix))
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func statusReply(sts []lockstore.Status) bsoncore.Document {
	aidx, arr := bsoncore.AppendArrayStart(nil)
	for i, st := range sts {
		idx, d := bsoncore.AppendDocumentStart(nil)
		d = bsoncore.AppendValueElement(d, "_id", st.ID.Core())
		d = bsoncore.AppendBooleanElement(d, "held", st.Held)
		d = bsoncore.AppendBooleanElement(d, "heldByYou", st.HeldByYou)
		if st.Held {
			d = bsoncore.AppendDocumentElement(d, "holder", refuse.HolderDocument(st.Holder))
			d = bsoncore.AppendDateTimeElement(d, "expiresAt", st.ExpiresAt.UnixMilli())
		} else {
			d = bsoncore.AppendNullElement(d, "holder")
			d = bsoncore.AppendNullElement(d, "expiresAt")
		}
		d = bsoncore.AppendInt64Element(d, "token", st.Token)
		if st.LastError != "" {
			d = bsoncore.AppendStringElement(d, "lastError", st.LastError)
		} else {
			d = bsoncore.AppendNullElement(d, "lastError")
		}
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		arr = bsoncore.AppendDocumentElement(arr, arrayKey(i), d)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d = bsoncore.AppendArrayElement(d, "locks", arr)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// namespaceHints are the likely namespace mistakes of a lock command that
// succeeded: a collection name that repeats the database name (run on
// database shop, "shop.orders" names shop.shop.orders), and, for
// acquireLock, a collection that does not exist, where a typo would
// otherwise show only as the next write's refusal.
func (s *Stage) namespaceHints(ctx context.Context, cmd *wire.Command, a *lockArgs) []string {
	var hints []string
	if rest, ok := strings.CutPrefix(a.coll, cmd.DB+"."); ok && rest != "" {
		hints = append(hints, fmt.Sprintf("the collection %q begins with the database name, so this names %s; "+
			"to name %s.%s, run {%s: %q} on database %s", a.coll, a.ns, cmd.DB, rest, cmd.Name, rest, cmd.DB))
	}
	if a.op == wire.LockAcquire {
		if c, ok := s.cfg.Collections, s.cfg.Collections != nil; ok {
			if exists, err := c.CollectionExists(ctx, a.ns); err == nil && !exists {
				if f, ok := s.cfg.Twins, s.cfg.Twins != nil; ok {
					if twin, ok := f.CaseTwin(ctx, a.ns); ok {
						hints = append(hints, fmt.Sprintf("the collection %s does not exist, %s does: names differ only by case, "+
							"and MongoDB's are case-sensitive, so this lock covers no write to %s", a.ns, twin, twin))
						return hints
					}
				}
				hints = append(hints, fmt.Sprintf("the collection %s does not exist (yet): the lock is held, but check the name "+
					"if your writes go to another collection", a.ns))
			}
		}
	}
	return hints
}

// withWarnings appends {warnings: [...]} to a reply document.
func withWarnings(reply bsoncore.Document, warnings []string) bsoncore.Document {
	if len(warnings) == 0 {
		return reply
	}
	aidx, arr := bsoncore.AppendArrayStart(nil)
	for i, w := range warnings {
		arr = bsoncore.AppendStringElement(arr, arrayKey(i), w)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, aidx)
	out := make([]byte, 0, len(reply)+len(arr)+16)
	out = append(out, reply[:len(reply)-1]...) // without the terminator
	out = bsoncore.AppendArrayElement(out, "warnings", arr)
	out = append(out, 0)
	return bsoncore.UpdateLength(out, 0, int32(len(out)))
}

// inOrder makes renewLock and releaseLock take effect in the order of the
// connection they arrive on: after the upstream has answered every request
// sent before them, so that a write sent just before a release is never
// still running when the lock is someone else's. The wait is bounded by
// OrderTimeout; past it the command is refused and the lock stays as it
// was, still covering the writes in flight.
func (s *Stage) inOrder(ctx context.Context, req *proxy.Request) *refuse.Error {
	op := req.Command.Spec().Lock
	if op != wire.LockRelease && op != wire.LockRenew {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.OrderTimeout)
	defer cancel()
	err := req.WaitAnswered(wctx)
	if err == nil && op == wire.LockRelease {
		// And the session's writes on its other connections.
		if session, ok := req.Command.SessionID(); ok {
			err = s.cfg.Flights.WaitSession(wctx, s.cfg.SessionKey(req.Client.User(), session))
		}
	}
	if err != nil {
		return &refuse.Error{Code: mongoerr.LockFailed, Reason: refuse.ReasonInFlight,
			Msg: fmt.Sprintf("lockgate: %s refused: requests sent before it on this connection, or this session's writes on its other connections, were still running after %v; "+
				"the locks stay as they were so that those writes remain covered; retry once they are answered", req.Command.Name, s.cfg.OrderTimeout)}
	}
	return nil
}

// mayLock: you may lock only what you may write, and see the locks of a
// namespace only if you may read it. Where the upstream requires
// authentication, acquireLock needs the caller's own update privilege on
// the namespace, and lockStatus its read privilege (lockStatus names
// holders and their last errors, which a caller who may not read the
// namespace has no business seeing).
func (s *Stage) mayLock(ctx context.Context, req *proxy.Request, a *lockArgs) *refuse.Error {
	var priv authority.Privilege
	var verb, rule string
	switch a.op {
	case wire.LockAcquire:
		priv, verb, rule = authority.Write, "write", "you may lock only what you may write"
	case wire.LockStatus:
		priv, verb, rule = authority.Read, "read", "you may see the locks of only what you may read"
	}
	if priv == "" || !s.cfg.Authority.Required() {
		return nil
	}
	allowed, err := s.cfg.Authority.Allows(ctx, req, priv, a.ns)
	if err != nil {
		return &refuse.Error{Code: mongoerr.LockBusy, Reason: refuse.ReasonUnavailable, NS: a.ns.String(),
			Msg: fmt.Sprintf("lockgate: %s: could not ask the database whether this connection may %s %s (%v); nothing was done", a.name, verb, a.ns, err)}
	}
	if !allowed {
		return &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonUnauthorized, NS: a.ns.String(),
			Msg: fmt.Sprintf("lockgate: %s refused: this connection's user may not %s %s, and %s", a.name, verb, a.ns, rule)}
	}
	return nil
}

// describeLSID names what a malformed lsid is, for the error message.
func describeLSID(v bsoncore.Value) string {
	doc, ok := v.DocumentOK()
	if !ok {
		return v.Type.String()
	}
	id := doc.Lookup("id")
	if sub, data, ok := id.BinaryOK(); ok {
		return fmt.Sprintf("an id of binary subtype %d and %d bytes", sub, len(data))
	}
	if id.Type == 0 {
		return "a document without id"
	}
	return "an id of type " + id.Type.String()
}

func arrayKey(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return fmt.Sprint(i)
}
