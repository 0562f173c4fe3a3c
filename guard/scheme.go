package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Refusal reasons under a locking scheme (docs/SCHEMES.md).
const (
	// reasonSchemeNotFollowed: the write is none of the scheme's steps.
	reasonSchemeNotFollowed = "scheme_not_followed"
	// reasonSchemeNotHolder: a holder's write from someone who does not
	// hold the scheme lock.
	reasonSchemeNotHolder = "scheme_not_holder"
)

// schemeKeys serialises, within this proxy, the acquires and releases of
// one scheme lock: the lock store decides between owners atomically, but
// two writers with the same identity (one application process under
// holder: client) are one owner to it.
type schemeKeys struct {
	mu sync.Mutex
	m  map[string]*schemeKey

	// instance tells this proxy's client-identity holders from the same
	// identity's through another proxy, which the lock store must then
	// decide between.
	once sync.Once
	bind string
}

// instanceBind is the owner binding of this proxy's client-identity
// holders: random per guard, hashed once.
func (s *schemeKeys) instanceBind(k *ownerKeys) string {
	s.once.Do(func() {
		var b [16]byte
		rand.Read(b[:])
		s.bind = k.bind("scheme instance " + hex.EncodeToString(b[:]))
	})
	return s.bind
}

type schemeKey struct {
	sync.Mutex
	users int
}

func (s *schemeKeys) lock(key string) func() {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]*schemeKey{}
	}
	k := s.m[key]
	if k == nil {
		k = &schemeKey{}
		s.m[key] = k
	}
	k.users++
	s.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		s.mu.Lock()
		if k.users--; k.users == 0 {
			delete(s.m, key)
		}
		s.mu.Unlock()
	}
}

// schemeOp is the one acquire or release of a command that the proxy
// runs itself, to see its outcome before the mirror lock is kept or
// dropped.
type schemeOp struct {
	rule  policy.Rule
	write policy.Write
	step  policy.Step
	owner lockstore.Owner
}

// schemeEnforce decides a command that writes to a namespace under a
// locking scheme; ok is false when none of its writes is under one.
func (g *Guard) schemeEnforce(ctx context.Context, req *proxy.Request, pol *policy.Policy, writes []policy.Write, rules []policy.Rule, start time.Time) (_ proxy.Decision, ok bool) {
	under := false
	for i := range writes {
		if rules[i].Mode != policy.Off && rules[i].Scheme.Active() {
			under = true
			break
		}
	}
	if !under {
		return proxy.Decision{}, false
	}
	v := &verdict{req: req}
	var ops []schemeOp
	for i, w := range writes {
		r := rules[i]
		if r.Mode == policy.Off {
			continue
		}
		v.writes = append(v.writes, w)
		if !r.Scheme.Active() {
			v.add(r, w, reasonUnclassifiable, nil, "one command writes to a namespace under a locking scheme and to another protected namespace; send them as separate commands")
			continue
		}
		if w.Kind == policy.KindCollectionWrite {
			if !r.AllowCollectionWrites {
				v.add(r, w, reasonCollectionWrite, nil, fmt.Sprintf("%s replaces or removes documents wholesale, which the policy does not allow on %s (allowCollectionWrites is false)", w.What, w.NS))
			}
			continue
		}
		st := policy.SchemeStep(r.Scheme, w)
		if st.Kind != policy.StepOther && st.Kind != policy.StepInsert && st.ID.Type == bson.TypeString && !g.exactStrings(ctx, w) {
			st = policy.Step{Why: "its string _id may match other documents under the collation in force; use the simple collation"}
		}
		var ids []docid.ID
		if st.ID.Type != 0 {
			id, err := idCopy(st.ID)
			if err != nil {
				v.add(r, w, reasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
				continue
			}
			ids = []docid.ID{id}
			v.named = append(v.named, ids...)
		}
		if r.Scheme.LockSide && st.Kind != policy.StepOther {
			if op, ok := g.lockCollPlan(ctx, v, req, r, w, st, ids); ok {
				ops = append(ops, op)
			}
			continue
		}
		switch st.Kind {
		case policy.StepInsert:
			g.schemeInsert(ctx, v, req, r, w)
		case policy.StepOther:
			v.add(r, w, reasonSchemeNotFollowed, ids, fmt.Sprintf("it does not follow the %s locking scheme of %s: %s; %s", r.Scheme.Type, w.NS, st.Why, schemeAdvice(r.Scheme)))
		case policy.StepAcquire:
			o, ok := g.schemeOwner(req, w.NS, r.Scheme, st.Holder)
			if !ok {
				v.add(r, w, reasonNoSession, ids, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
				continue
			}
			ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o})
		case policy.StepHolder:
			if st.ReleaseAll {
				o, ok := g.schemeOwner(req, w.NS, r.Scheme, st.Holder)
				if !ok {
					v.add(r, w, reasonNoSession, nil, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
					continue
				}
				ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o})
				continue
			}
			o, mirrored, ok := g.schemeHolder(ctx, v, req, r, w, st, ids)
			if ok && mirrored && st.Ends {
				ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o})
			}
		}
	}
	if len(ops) > 0 && (len(writes) > 1 || req.Command == nil || req.Command.MoreToCome) {
		w := ops[0].write
		v.add(ops[0].rule, w, reasonSchemeNotFollowed, nil, fmt.Sprintf("it takes or releases a %s lock %s; send each acquire and release as its own acknowledged single-statement command",
			ops[0].rule.Scheme.Type, map[bool]string{true: "without acknowledgement (w: 0)", false: "together with other statements"}[req.Command != nil && req.Command.MoreToCome && len(writes) == 1]))
		ops = nil
	}
	if len(v.stale) == 1 && len(v.violations) == 1 && len(writes) == 1 && v.violations[0].rule.Mode == policy.Enforce &&
		req.Command != nil && !req.Command.MoreToCome {
		x := v.violations[0]
		g.record(req, pol, v, &x, time.Since(start))
		st := policy.SchemeStep(x.rule.Scheme, x.write)
		return proxy.Decision{Action: proxy.Reply, Reply: noMatch(x.write, st, false)}, true
	}
	if len(ops) == 0 || v.enforcedViolation() {
		return g.decide(req, pol, v, start), true
	}
	return g.schemeRun(ctx, req, pol, v, ops[0], start), true
}

// schemeHolder checks a holder's write: who holds the scheme lock must be
// the writer. For holderFields and lockDocument the holder value is in the
// write's filter, so the write itself matches nothing unless the document
// still names that holder; the mirror lock only has to be nobody else's.
// A flag write carries no holder value: the mirror is the only check.
// mirrored reports whether the writer holds the mirror lock (a release
// must then drop it).
func (g *Guard) schemeHolder(ctx context.Context, v *verdict, req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID) (o lockstore.Owner, mirrored, ok bool) {
	o, ok = g.schemeOwner(req, w.NS, r.Scheme, st.Holder)
	if !ok {
		v.add(r, w, reasonNoSession, ids, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
		return o, false, false
	}
	store := g.opts.Store
	mns := r.Scheme.MirrorNS(w.NS)
	held, _, err := store.Holds(ctx, o, mns, ids, r.LeaseMargin)
	if err != nil {
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable,
			detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		return o, false, false
	}
	lease := schemeLease(r.Scheme, st)
	if held {
		v.check(w.NS, ids)
		renew := st.Renew
		if r.Scheme.Type == config.SchemeFlag && !st.Ends {
			// A flag has no lease of its own: the holder's writes keep
			// the mirror alive, renewed once half of it is gone.
			half, _, _ := store.Holds(ctx, o, mns, ids, r.Scheme.Lease/2)
			renew = !half
		}
		if renew && !st.Ends {
			if _, err := store.Renew(ctx, o, mns, ids, lease); err != nil {
				g.log.Debug("scheme lock renewal failed", zap.String("ns", w.NS), zap.Error(err))
			}
		}
		return o, true, true
	}
	sts, err := store.Status(ctx, o, mns, ids)
	if err != nil || len(sts) != 1 {
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable,
			detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		return o, false, false
	}
	s := sts[0]
	switch {
	case s.Held && !s.HeldByYou:
		h := s.Holder
		if !r.Scheme.IdentityHolder() {
			// A holder whose lock was taken over: on the database its
			// write would match nothing, once the new holder's acquire
			// has landed; it may not land before (conditional writes
			// are not atomic everywhere). It gets the database's answer.
			v.stale = append(v.stale, len(v.violations))
		}
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonSchemeNotHolder, ids: ids, holder: &h,
			detail: fmt.Sprintf("under the %s locking scheme of %s the lock on _id %s belongs to another holder (%s); %s", r.Scheme.Type, w.NS, ids[0].String(), describeHolder(h), schemeAdvice(r.Scheme))})
		return o, false, false
	case s.HeldByYou:
		// Less than the margin left. A flag's holder keeps its lock by
		// writing, and a write that refreshes the scheme's own time
		// (LockTime, expiresAt, ts) renews it; other writes do not,
		// or the scheme's expiry would never come while the holder
		// writes. holderFields and lockDocument writes check the holder
		// in their own filter, so they may go on until the mirror ends;
		// a lockCollection data write has no such check.
		if r.Scheme.Type == config.SchemeFlag || st.Renew {
			if _, err := store.Renew(ctx, o, mns, ids, lease); err == nil {
				return o, true, true
			}
		} else if !r.Scheme.IdentityHolder() {
			return o, true, true
		}
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonSchemeNotHolder, ids: ids,
			detail: fmt.Sprintf("under the %s locking scheme of %s this client's lock on _id %s has less than the policy's margin of %v left; %s", r.Scheme.Type, w.NS, ids[0].String(), r.LeaseMargin, schemeAdvice(r.Scheme))})
		return o, false, false
	}
	// Nobody holds the mirror, as far as a read can tell (a read may lag
	// an acquire by milliseconds, so it is no permission by itself):
	//   - a holder-field write whose lock expired and was not taken over
	//     lands on the database (its filter still names the holder the
	//     document has), so it goes on;
	//   - clearing a flag, deleting a lock record, or releasing an
	//     expired holder-field lock is the recovery of an abandoned lock,
	//     which the scheme leaves to whoever notices (or to a TTL index).
	// Each runs under a mirror taken now, atomically, just long enough
	// for the write in flight: an acquire arriving meanwhile neither
	// races it (conditional writes are not atomic everywhere) nor is
	// undone by it, and a takeover waits at most policy.leaseMarginMS.
	recovery := st.Ends && (!st.Delete || !r.Scheme.IdentityHolder())
	if !r.Scheme.IdentityHolder() || recovery {
		short := r.LeaseMargin
		if short < 100*time.Millisecond {
			short = 100 * time.Millisecond
		}
		_, err := store.Acquire(ctx, o, mns, ids, short, 0)
		switch {
		case err == nil:
			return o, true, true
		case errors.Is(err, lockstore.ErrBusy):
			if !r.Scheme.IdentityHolder() {
				// Taken over: the database's answer is "nothing matched".
				v.stale = append(v.stale, len(v.violations))
			}
			v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonSchemeNotHolder, ids: ids,
				detail: fmt.Sprintf("under the %s locking scheme of %s the lock on _id %s has just been taken by another holder; %s", r.Scheme.Type, w.NS, ids[0].String(), schemeAdvice(r.Scheme))})
		default:
			v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable,
				detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		}
		return o, false, false
	}
	v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonSchemeNotHolder, ids: ids,
		detail: fmt.Sprintf("under the %s locking scheme of %s this client does not hold the lock on _id %s (or its lease of %v ran out); %s", r.Scheme.Type, w.NS, ids[0].String(), r.Scheme.Lease, schemeAdvice(r.Scheme))})
	return o, false, false
}

// schemeRun runs an acquire, or a release of a mirrored lock, on the
// client's own upstream connection and answers with the upstream's reply:
// the application sees exactly what the database said, and the mirror
// follows what the database did.
func (g *Guard) schemeRun(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *verdict, op schemeOp, start time.Time) proxy.Decision {
	w, st, r := op.write, op.step, op.rule
	if r.Scheme.LockSide {
		return g.lockCollRun(ctx, req, pol, v, op, start)
	}
	id, err := idCopy(st.ID)
	if err != nil {
		// schemeEnforce refused such a step already.
		v.add(r, w, reasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
		return g.decide(req, pol, v, start)
	}
	ids := []docid.ID{id}
	mns := r.Scheme.MirrorNS(w.NS)
	unlock := g.schemes.lock(mns + "\x00" + id.Key())
	defer unlock()
	store := g.opts.Store
	body, err := statementBody(req.Command, w)
	if err != nil {
		v.add(r, w, reasonUnclassifiable, ids, fmt.Sprintf("the proxy cannot run its %s step on its own (%v)", r.Scheme.Type, err))
		return g.decide(req, pol, v, start)
	}
	if st.Kind == policy.StepHolder { // a release
		reply, err := req.Ask(ctx, body)
		if err != nil {
			// Whether it was written is unknown: the mirror stays and
			// expires with its lease; the driver sees a network error.
			return proxy.Decision{Action: proxy.Close, Reason: "scheme release: " + err.Error()}
		}
		if _, err := store.Release(ctx, op.owner, mns, ids, ""); err != nil {
			g.log.Warn("scheme lock release failed; it expires with its lease", zap.String("ns", w.NS), zap.Error(err))
		}
		v.check(w.NS, ids)
		g.record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Reply, Reply: reply}
	}
	if r.Scheme.IdentityHolder() {
		// The same holder setting a flag it holds: the database would
		// say "not modified", and must, though it might not (its
		// test-and-set is not atomic everywhere). Likewise a second
		// lock record from the holder of the first.
		mine, _, err := store.Holds(ctx, op.owner, mns, ids, 0)
		if err != nil {
			v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable, ids: ids,
				detail: fmt.Sprintf("the lock store cannot take the scheme lock (%v); nothing was written", err)})
			return g.decide(req, pol, v, start)
		}
		if mine {
			return g.schemeBusy(req, pol, v, r, w, st, start)
		}
	}
	if _, err := store.Acquire(ctx, op.owner, mns, ids, schemeLease(r.Scheme, st), 0); err != nil {
		if errors.Is(err, lockstore.ErrBusy) {
			return g.schemeBusy(req, pol, v, r, w, st, start)
		}
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable, ids: ids,
			detail: fmt.Sprintf("the lock store cannot take the scheme lock (%v); nothing was written", err)})
		return g.decide(req, pol, v, start)
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		// Unknown outcome. Holding the mirror for a lock that may not
		// exist only delays the next acquire by a lease; dropping it
		// could let two holders in.
		return proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}
	}
	if !acquired(reply, w) {
		if _, err := store.Release(ctx, op.owner, mns, ids, ""); err != nil {
			g.log.Warn("scheme lock release after a failed acquire failed; it expires with its lease", zap.String("ns", w.NS), zap.Error(err))
		}
	} else {
		v.check(w.NS, ids)
	}
	g.record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: reply}
}

// schemeBusy answers an acquire of a lock someone else holds with the
// scheme's own failure signal: "not modified" for an update, no document
// for findAndModify, DuplicateKey where the upsert would have collided
// with the holder's document. Audited namespaces forward the write.
func (g *Guard) schemeBusy(req *proxy.Request, pol *policy.Policy, v *verdict, r policy.Rule, w policy.Write, st policy.Step, start time.Time) proxy.Decision {
	if r.Mode != policy.Enforce {
		g.record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Forward}
	}
	g.record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: noMatch(w, st, w.Upsert && r.Scheme.Type != config.SchemeFlag)}
}

// noMatch is the reply of the database to write w when its filter matches
// nothing: DuplicateKey where an upsert would then collide with the
// existing document (dup), "nothing matched" otherwise.
func noMatch(w policy.Write, st policy.Step, dup bool) bsoncore.Document {
	errmsg := fmt.Sprintf("E11000 duplicate key error collection: %s index: _id_ dup key: { _id: %s }", w.NS, docid.Format(bson.RawValue{Type: st.ID.Type, Value: st.ID.Data}))
	idx, d := bsoncore.AppendDocumentStart(nil)
	switch {
	case w.Kind == policy.KindFindAndModify && dup:
		extra := bsoncore.AppendDocumentElement(nil, "keyPattern", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build())
		extra = bsoncore.AppendDocumentElement(extra, "keyValue", bsoncore.NewDocumentBuilder().AppendValue("_id", st.ID).Build())
		return wire.ErrorDocument(11000, "DuplicateKey", errmsg, extra)
	case w.Kind == policy.KindFindAndModify:
		d = bsoncore.AppendDocumentElement(d, "lastErrorObject", bsoncore.NewDocumentBuilder().
			AppendInt32("n", 0).AppendBoolean("updatedExisting", false).Build())
		d = bsoncore.AppendNullElement(d, "value")
	case w.Kind == policy.KindDelete:
		d = bsoncore.AppendInt32Element(d, "n", 0)
	default:
		d = bsoncore.AppendInt32Element(d, "n", 0)
		d = bsoncore.AppendInt32Element(d, "nModified", 0)
		if dup {
			we := bsoncore.NewDocumentBuilder().AppendInt32("index", int32(w.Index)).AppendInt32("code", 11000).
				AppendString("errmsg", errmsg).Build()
			d = bsoncore.AppendArrayElement(d, "writeErrors", bsoncore.NewArrayBuilder().AppendDocument(we).Build())
		}
	}
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// acquired reads the upstream's reply to an acquire: did it take the lock?
func acquired(reply bsoncore.Document, w policy.Write) bool {
	if ok, _ := reply.Lookup("ok").AsInt64OK(); ok != 1 {
		return false
	}
	if w.Kind == policy.KindFindAndModify {
		leo, ok := reply.Lookup("lastErrorObject").DocumentOK()
		if !ok {
			return false
		}
		if b, ok := leo.Lookup("updatedExisting").BooleanOK(); ok && b {
			return true
		}
		_, err := leo.LookupErr("upserted")
		return err == nil
	}
	if _, err := reply.LookupErr("writeErrors"); err == nil {
		return false
	}
	if w.Kind == policy.KindInsert {
		n, ok := reply.Lookup("n").AsInt64OK()
		return ok && n > 0
	}
	if n, ok := reply.Lookup("nModified").AsInt64OK(); ok && n > 0 {
		return true
	}
	if up, ok := reply.Lookup("upserted").ArrayOK(); ok {
		vals, _ := up.Values()
		return len(vals) > 0
	}
	return false
}

// statementBody is the command of write w as one body document, its
// statement folded in from a document sequence if it sat in one: the form
// Request.Ask sends.
func statementBody(cmd *wire.Command, w policy.Write) (bsoncore.Document, error) {
	if cmd == nil {
		return nil, errors.New("not a command")
	}
	elems, err := cmd.Body.Elements()
	if err != nil {
		return nil, err
	}
	idx, b := bsoncore.AppendDocumentStart(nil)
	hasDB := false
	for _, e := range elems {
		if w.List != "" && e.Key() == w.List {
			continue
		}
		hasDB = hasDB || e.Key() == "$db"
		b = append(b, e...)
	}
	if w.List != "" {
		docs, err := cmd.Documents(w.List)
		if err != nil {
			return nil, err
		}
		if w.Index < 0 || w.Index >= len(docs) {
			return nil, fmt.Errorf("statement %d of %s is missing", w.Index, w.List)
		}
		b = bsoncore.AppendArrayElement(b, w.List, bsoncore.NewArrayBuilder().AppendDocument(docs[w.Index]).Build())
	}
	if !hasDB {
		b = bsoncore.AppendStringElement(b, "$db", cmd.DB)
	}
	b, err = bsoncore.AppendDocumentEnd(b, idx)
	return b, err
}

// schemeOwner is the mirror lock's owner. holderFields and lockDocument:
// the holder value itself (keyed, per namespace), so that whoever names it
// is the holder, as in the scheme. flag: the client identity the rule
// names.
func (g *Guard) schemeOwner(req *proxy.Request, ns string, s policy.Scheme, holder bsoncore.Value) (lockstore.Owner, bool) {
	c := req.Client
	o := lockstore.Owner{App: c.AppName(), Client: c.Addr, User: c.User()}
	if !s.IdentityHolder() {
		key := append([]byte("lockgate scheme holder v1\x00"+ns+"\x00"), byte(holder.Type))
		o.Session = g.owners.session("", append(key, holder.Data...))
		return o, true
	}
	if s.Holder == config.SchemeHolderSession {
		if req.Command == nil {
			return o, false
		}
		sid, ok := req.Command.SessionID()
		if !ok {
			return o, false
		}
		return g.owner(req, sid, ""), true
	}
	host := c.Addr
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		host = a.IP.String()
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		host = h
	}
	o.Session = g.owners.session(o.User, []byte("lockgate scheme client v1\x00"+o.App+"\x00"+host))
	// One application process is one owner per proxy: two proxies that
	// see the same identity must not both be granted the same flag.
	o.Bind = g.schemes.instanceBind(g.owners)
	return o, true
}

// schemeLease is how long the mirror lives after an acquire or renew.
func schemeLease(s policy.Scheme, st policy.Step) time.Duration {
	if s.Type == config.SchemeLockDocument && !st.Expires.IsZero() {
		d := time.Until(st.Expires)
		if d < time.Second {
			d = time.Second
		}
		return d
	}
	return s.Lease
}

// schemeAdvice says how a writer follows the scheme.
func schemeAdvice(s policy.Scheme) string {
	switch s.Type {
	case config.SchemeHolderFields:
		return fmt.Sprintf("take the lock with findOneAndUpdate({_id, $or: [{%[1]s: null}, {%[2]s older than the lease}]}, {$set: {%[1]s: <your id>, %[2]s: now}}, upsert), name %[1]s: <your id> in the filter of every write, and release by setting %[1]s to null", s.HolderPath, s.TimePath)
	case config.SchemeLockDocument:
		return fmt.Sprintf("take the lock by setting %s (with %s) where there is none or it has expired, name %s: <you> in the filter of every write, and release by clearing %s", s.HolderPath, s.ExpiresPath, s.HolderPath, s.LockPath)
	case config.SchemeLockCollection:
		return fmt.Sprintf("take the lock by inserting {_id: <document _id>, %s, %s} into %s from this client (DuplicateKey: busy), write, then delete that record", s.TsPath, s.AidPath, lockCollName(s))
	case config.SchemeFlag:
		return fmt.Sprintf("take the lock with updateOne({_id, %[1]s: false}, {$set: {%[1]s: true}}) from this client, write, then set %[1]s back to false", s.LockPath)
	}
	return "follow the namespace's locking scheme"
}

// ruleFor is rule r as it applies to the request's client (a rule may be
// narrowed to some clients, config.Clients).
func (g *Guard) ruleFor(r policy.Rule, req *proxy.Request) policy.Rule {
	if r.Clients == nil {
		return r
	}
	c := req.Client
	var ip net.IP
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		ip = a.IP
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		ip = net.ParseIP(h)
	}
	return r.ForClient(c.AppName(), c.User(), ip)
}

// schemeInsert refuses, under inserts: requireUnlocked, an insert of an
// _id whose scheme lock someone else holds (lock, then create): as for
// lockgate's own locks, with no lock store read where no lock is held in
// the namespace.
func (g *Guard) schemeInsert(ctx context.Context, v *verdict, req *proxy.Request, r policy.Rule, w policy.Write) {
	if r.Inserts != policy.InsertsRequireUnlocked {
		return
	}
	id, found, certain := policy.InsertID(w)
	if !certain {
		v.add(r, w, reasonUnclassifiable, nil, "the inserted document's _id cannot be told with certainty (it appears twice)")
		return
	}
	if !found {
		return
	}
	if id, found = r.Scheme.MirrorID(id); !found {
		return // no lock record can name it
	}
	mns := r.Scheme.MirrorNS(w.NS)
	if h, ok := g.opts.Store.(lockTeller); ok && !h.MayHoldLocks(mns) {
		return
	}
	var o lockstore.Owner
	if r.Scheme.IdentityHolder() {
		o, _ = g.schemeOwner(req, w.NS, r.Scheme, bsoncore.Value{})
	}
	if o.Session == nil {
		o.Session = make([]byte, 16) // nobody: a holder-field insert names no holder
	}
	did, err := idCopy(id)
	if err != nil {
		return // no lock can be held on it; the database refuses it
	}
	ids := []docid.ID{did}
	sts, err := g.confirmedStatus(ctx, o, mns, ids)
	if err != nil {
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable,
			detail: fmt.Sprintf("the lock store cannot confirm that the inserted _id is unlocked (%v)", err)})
		return
	}
	if len(sts) == 1 && sts[0].Held && !sts[0].HeldByYou {
		h := sts[0].Holder
		v.named = append(v.named, ids...)
		v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonInsertLocked, ids: ids, holder: &h,
			detail: fmt.Sprintf("another holder has locked _id %s under the %s locking scheme, and this insert would create it (%s)", ids[0].String(), r.Scheme.Type, describeHolder(h))})
	}
}
