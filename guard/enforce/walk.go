package enforce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/txn"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Walk is enforcement's walk over the writes of one request: the rule of
// each, the refusals no lock is needed for, the documents each statement
// needs locked (resolving filters that name no _id last, and only while
// the command can still be allowed), and the lock check of them. What
// acts on an allowed write around it (the fence, the implicit locks, the
// transaction's record) and the decision are funcs the guard sets; V is
// its verdict, handed back to them untouched. Its funcs are set once and
// the Walk shared.
type Walk[V any] struct {
	Targets *Targets
	Checker *Checker[V]
	// AuthRequired reports whether the database requires authentication
	// (it may learn so later), so that a connection that has not
	// authenticated holds no lock; nil: it does not.
	AuthRequired func() bool
	// Rules is the rule of ns for req's client: the connection's own
	// copy, shared, not copied (Rules.Ref).
	Rules func(pol *policy.Policy, req *proxy.Request, ns namespace.Namespace) []policy.Rule
	// New returns a verdict for req, started at start, and its
	// enforcement part.
	New func(req *proxy.Request, start time.Time) (V, *Verdict)
	// Schemes decides writes under a locking scheme; false: none is.
	Schemes func(ctx context.Context, req *proxy.Request, pol *policy.Policy, writes []policy.Write, rules []policy.Rule, start time.Time) (proxy.Decision, bool)
	// Owner is the lock owner req acts as, which it records on v; false
	// (and nil): req carries no session. The owner is shared, by pointer:
	// it is too large to copy into every func of the walk, and no one
	// writes to it once it is handed out (the guard makes it in the
	// write's verdict, which is reused only once its flight landed), so
	// a write's flight keeps the pointer until it lands;
	// anything else that keeps it past the decision keeps a copy (a
	// memo's fields).
	Owner func(req *proxy.Request, v V) (*lockstore.Owner, bool)
	// Fence notes w and the ids it targets for the fence, for a rule
	// that names a fence field (the walk asks for no other); nil: none.
	Fence func(v V, r *policy.Rule, w policy.Write, ids []docid.ID)
	// ImplicitInsert takes an insert of id under a rule with implicit
	// locks from the walk.
	ImplicitInsert func(v V, ns namespace.Namespace, r *policy.Rule, id docid.ID)
	// Implicit takes the implicit locks of the writes left to them, once
	// every lock is checked, and returns the inserts whose locks are
	// still to be checked; nil: none are taken.
	Implicit func(ctx context.Context, v V, o *lockstore.Owner, inserts Needs) Needs
	// Checked runs once the locks are checked, before a transaction's
	// statement is recorded (the fence's inserts); nil: nothing does.
	Checked func(ctx context.Context, v V, o *lockstore.Owner, hasSession bool)
	// Txn records what an allowed statement of a transaction needs at its
	// commit; nil: statements of transactions are not recorded.
	Txn func(ctx context.Context, req *proxy.Request, v V, o *lockstore.Owner, inserts Needs)
	// Settle runs before the decision (the resolution time charged or
	// credited) and reports whether Decided is to see it: Decided, given
	// the decision, returns the one made (the implicit locks released
	// unless launched). Asked before the decision, as a launched write's
	// verdict is its flight's. nil: nothing.
	Settle  func(v V) bool
	Decided func(v V, d proxy.Decision) proxy.Decision
	Decider *Decider[V]

	// noOwner is the owner of a request that carries no session: the
	// zero owner, which holds nothing. Never written.
	noOwner lockstore.Owner
}

// Run decides writes, the writes of req, under pol, from start.
func (k *Walk[V]) Run(ctx context.Context, req *proxy.Request, pol *policy.Policy, writes []policy.Write, start time.Time) proxy.Decision {
	// The rule of each write, looked up once for the decision and the
	// audit line; nothing is allocated for a command that writes only
	// where nothing is protected.
	var rules []policy.Rule
	var v V
	var b *Verdict
	off := 0
	for i := range writes {
		// The usual write of one namespace points at the connection's
		// copy of its rule. By index: a copy of each write (about 250
		// bytes) cost every write more than the look-up.
		rr := k.Rules(pol, req, writes[i].NS)
		if rr[0].Mode == policy.Off {
			off++
		}
		if rules == nil {
			if rr[0].Mode == policy.Off {
				continue
			}
			v, b = k.New(req, start)
			if len(writes) == 1 {
				rules = rr
				continue
			}
			rules = k.rulesBefore(pol, req, writes, i)
		}
		rules = append(rules, rr[0])
	}
	if rules == nil {
		return proxy.Decision{Action: proxy.Forward}
	}
	b.Checked = b.CheckedBuf[:0]
	switch {
	case off == 0:
		b.Writes, b.Rules = writes, rules
	case off < len(writes):
		protectedOnly(b, writes, rules)
	}
	if len(b.Writes) == 0 {
		return proxy.Decision{Action: proxy.Forward}
	}
	// Where the database requires authentication, a connection that has
	// not authenticated may write nothing and holds no lock. Its enforced
	// writes are refused before any lock is looked at, so that no answer
	// depends on one: an insert of a locked _id would otherwise be refused
	// here and one of a free _id by the database, telling which is locked.
	if k.AuthRequired != nil && k.AuthRequired() && req.Client.User() == "" {
		if d, ok := k.unauthenticated(req, pol, v, b, start); ok {
			return d
		}
	}
	if k.Schemes != nil && underScheme(writes, rules) {
		if d, ok := k.Schemes(ctx, req, pol, writes, rules, start); ok {
			return d
		}
	}

	o, hasSession := k.Owner(req, v)
	if o == nil {
		o = &k.noOwner
	}
	var deferred []int // writes whose documents must be resolved first
	need := Needs(b.NeedBuf[:0])
	var inserts Needs
	collate := false // an insert or upsert may need the collation check (collated)
	for i := range writes {
		// Both by pointer: a rule and a write are too large to copy on
		// every call, and a copy held across calls is zeroed on entry.
		r, w := &rules[i], &writes[i]
		if r.Mode == policy.Off {
			continue
		}
		switch w.Kind {
		case policy.KindCollectionWrite:
			if !r.AllowCollectionWrites {
				collectionWrite(b, r, w)
			}
		case policy.KindInsert:
			collate = k.insert(ctx, v, b, r, w, &inserts) || collate
		default:
			if !hasSession && !r.Implicit() {
				noSession(b, r, w)
				continue
			}
			if w.Upsert && k.cappedInsertRefused(ctx, b, r, w) {
				continue
			}
			collate = collate || Collatable(r, w, bsoncore.Value{})
			ids, ok, later := k.targets(ctx, b, r, w, false)
			if later {
				deferred = append(deferred, i)
				continue
			}
			if !ok {
				continue
			}
			k.fence(v, r, w, ids)
			need.Add(w.NS, r, ids...)
		}
	}
	k.Checker.Needs(ctx, v, b, o, need)
	// Statements whose filter names no _id are resolved last, and only
	// while the command can still be allowed: a query for the documents
	// they match is the expensive part, and pointless once anything in the
	// command is refused.
	if len(deferred) > 0 {
		k.resolveDeferred(ctx, v, b, o, writes, rules, deferred)
	}
	if k.Implicit != nil {
		inserts = k.Implicit(ctx, v, o, inserts)
	}
	if len(inserts) > 0 {
		k.insertable(ctx, b, o, inserts)
	}
	if collate {
		k.collated(ctx, b, o, writes, rules)
	}
	if k.Checked != nil {
		k.Checked(ctx, v, o, hasSession)
	}
	if hasSession {
		b.InTxn = txn.In(req.Command)
	}
	if b.InTxn && !b.EnforcedViolation() && k.Txn != nil {
		k.Txn(ctx, req, v, o, inserts)
	}
	after := k.Settle != nil && k.Settle(v)
	d := k.Decider.decide(req, pol, v, b, start)
	if after {
		return k.Decided(v, *d)
	}
	return *d
}

// The walk's branches that the usual write (one allowed statement) does
// not take are functions of their own, not inlined: Run's frame held
// every copy of a rule and a write they make (b.Add's arguments by
// value, fmt's) and every value they keep live, about 3 KB of stack,
// and the usual write paid for that frame in spills around each call.

// rulesBefore is the rules of writes[:i], the first i writes of a
// message whose first protected write is i, with room for the rest.
//
//go:noinline
func (k *Walk[V]) rulesBefore(pol *policy.Policy, req *proxy.Request, writes []policy.Write, i int) []policy.Rule {
	rules := make([]policy.Rule, i, len(writes))
	for j := range rules {
		rules[j] = k.Rules(pol, req, writes[j].NS)[0]
	}
	return rules
}

// protectedOnly puts on b the writes whose rule is not off, and their
// rules.
//
//go:noinline
func protectedOnly(b *Verdict, writes []policy.Write, rules []policy.Rule) {
	for i := range writes {
		if rules[i].Mode != policy.Off {
			b.Writes, b.Rules = append(b.Writes, writes[i]), append(b.Rules, rules[i])
		}
	}
}

// unauthenticated refuses the first enforced write of a connection that
// has not authenticated where the database requires it; false: none is
// enforced.
//
//go:noinline
func (k *Walk[V]) unauthenticated(req *proxy.Request, pol *policy.Policy, v V, b *Verdict, start time.Time) (proxy.Decision, bool) {
	for i, w := range b.Writes {
		if b.Rules[i].Mode == policy.Enforce {
			b.Add(b.Rules[i], w, refuse.ReasonUnauthenticated, nil, "this connection has not authenticated, and the database requires it, so it holds no lock")
			return k.Decider.Decide(req, pol, v, b, start), true
		}
	}
	return proxy.Decision{}, false
}

// collectionWrite refuses w, a collection-wide write, where r does not
// allow those.
//
//go:noinline
func collectionWrite(b *Verdict, r *policy.Rule, w *policy.Write) {
	b.Add(*r, *w, ReasonCollectionWrite, nil, fmt.Sprintf("%s replaces or removes documents wholesale, which the policy does not allow on %s (allowCollectionWrites is false)", w.What, w.NS))
}

// noSession refuses w, which needs locks, in a command without a session.
//
//go:noinline
func noSession(b *Verdict, r *policy.Rule, w *policy.Write) {
	b.Add(*r, *w, refuse.ReasonNoSession, nil, "the command carries no logical session (lsid), so it cannot hold locks")
}

// resolveDeferred resolves the statements whose filter names no _id,
// writes[deferred], and checks the locks of what they match, unless the
// command is refused already.
//
//go:noinline
func (k *Walk[V]) resolveDeferred(ctx context.Context, v V, b *Verdict, o *lockstore.Owner, writes []policy.Write, rules []policy.Rule, deferred []int) {
	if b.EnforcedViolation() {
		k.Targets.Skipped(len(deferred))
		return
	}
	var resolved Needs
	for _, i := range deferred {
		ids, ok, _ := k.targets(ctx, b, &rules[i], &writes[i], true)
		if ok {
			k.fence(v, &rules[i], &writes[i], ids)
			resolved.Add(writes[i].NS, &rules[i], ids...)
		}
	}
	k.Checker.Needs(ctx, v, b, o, resolved)
}

// insertable checks that the inserted ids of inserts are not locked.
//
//go:noinline
func (k *Walk[V]) insertable(ctx context.Context, b *Verdict, o *lockstore.Owner, inserts Needs) {
	for _, n := range inserts {
		k.Checker.Insertable(ctx, b, n.Rule, o, n.NS, n.IDs)
	}
}

// Unclassifiable decides a write that cannot be read with certainty
// (err), into v: refused where its namespace (else its database, else
// everything) is enforced.
func (k *Walk[V]) Unclassifiable(req *proxy.Request, pol *policy.Policy, v V, b *Verdict, err error, start time.Time) proxy.Decision {
	ns := namespace.Unknown()
	var ce *policy.ClassifyError
	if errors.As(err, &ce) && !ce.NS.IsZero() {
		ns = ce.NS
	} else if req.Command != nil {
		ns = policy.DBNamespace(req.Command.DB)
	}
	r := pol.Lookup(ns)
	if r.Mode == policy.Off {
		return proxy.Decision{Action: proxy.Forward}
	}
	b.Add(r, policy.Write{NS: ns}, ReasonUnclassifiable, nil, fmt.Sprintf("the proxy cannot tell with certainty what it writes (%v)", err))
	return k.Decider.Decide(req, pol, v, b, start)
}

// insert takes insert w into the walk: fenced, refused into a capped
// collection, and, where the rule requires its _id unlocked, the lock to
// check (into inserts, or an implicit lock's). collate: it may need the
// collation check too (Collatable).
func (k *Walk[V]) insert(ctx context.Context, v V, b *Verdict, r *policy.Rule, w *policy.Write, inserts *Needs) (collate bool) {
	k.fence(v, r, w, nil)
	if k.cappedInsertRefused(ctx, b, r, w) || r.Inserts != policy.InsertsRequireUnlocked {
		return false
	}
	id, found, certain := policy.InsertID(*w)
	switch {
	case !certain:
		b.Add(*r, *w, ReasonUnclassifiable, nil, "the inserted document's _id cannot be told with certainty (it appears twice)")
	case found:
		// A value that cannot be an _id names no lock, and the database
		// refuses the insert itself.
		if did, err := IDCopy(id); err == nil {
			if r.Implicit() {
				k.ImplicitInsert(v, w.NS, r, did)
			} else {
				inserts.Add(w.NS, r, did)
			}
		}
		return Collatable(r, w, id)
	}
	return false
}

// underScheme reports whether a write is under a locking scheme: only
// then are the schemes asked (Walk.Schemes), whose unit would find the
// same and return.
func underScheme(writes []policy.Write, rules []policy.Rule) bool {
	for i := range writes {
		if r := &rules[i]; r.Mode != policy.Off && r.Scheme.Active() {
			return true
		}
	}
	return false
}

// fence is Walk.Fence, called only for a rule that names a fence field.
// w by pointer: inlined, a write by value is copied on every write,
// fenced or not.
func (k *Walk[V]) fence(v V, r *policy.Rule, w *policy.Write, ids []docid.ID) {
	if k.Fence != nil && r.FenceField != "" {
		k.fenced(v, r, w, ids)
	}
}

// fenced calls Fence, apart: the write's copy for it would otherwise sit
// in the frame of every caller of fence.
//
//go:noinline
func (k *Walk[V]) fenced(v V, r *policy.Rule, w *policy.Write, ids []docid.ID) {
	k.Fence(v, r, *w, ids)
}

// cappedInsertRefused records a violation for an insert, or an upsert
// that may insert, into a capped collection (Targets.Capped).
// w by pointer, not inlined: a write by value (about 250 bytes) was
// copied into the walk's frame for the call.
//
//go:noinline
func (k *Walk[V]) cappedInsertRefused(ctx context.Context, b *Verdict, r *policy.Rule, w *policy.Write) bool {
	reason, detail := k.Targets.Capped(ctx, r, *w)
	if reason == "" {
		return false
	}
	b.Add(*r, *w, reason, nil, detail)
	return true
}

// targets returns the ids whose locks write w needs (Targets.Of) and
// records on b what it found: the ids the request names, the pin of a
// resolved statement, the resolution's time, the violation that stops
// the write. later: w must be resolved, and resolve was false.
func (k *Walk[V]) targets(ctx context.Context, b *Verdict, r *policy.Rule, w *policy.Write, resolve bool) (_ []docid.ID, ok, later bool) {
	var x Target
	k.Targets.Of(ctx, b.Req, r, w, resolve, b.Blocked(w.NS), b.PinBuf[:0], &x)
	if x.Pinned != nil {
		b.Name(w.NS, x.Pinned)
	}
	if x.HasUpserted || x.Resolved || x.Pins || x.Reason != "" {
		targetsFound(b, r, w, &x)
	}
	return x.IDs, x.OK, x.Later
}

// targetsFound records on b what Targets.Of found for w besides the ids
// the request names: an upsert's _id, a resolution, a pin, a violation.
// Apart and not inlined: the usual write (one pinned _id) finds none of
// them, and their code, inlined into the walk by the profile-guided
// build, spread the walk's usual path over more cache lines.
//
//go:noinline
func targetsFound(b *Verdict, r *policy.Rule, w *policy.Write, x *Target) {
	if x.HasUpserted {
		b.NameOne(w.NS, x.Upserted)
	}
	if x.Resolved {
		b.Now = time.Time{} // read again after the resolution
		b.ResolveSpent += x.Spent
	}
	if x.Pins {
		b.Pins = append(b.Pins, x.Pin)
	}
	if x.Reason != "" {
		refused(b, r, w, x)
	}
}

// refused records the violation x found for w. Apart from targets, whose
// frame held the rule's and the write's copies for it.
//
//go:noinline
func refused(b *Verdict, r *policy.Rule, w *policy.Write, x *Target) {
	b.Add(*r, *w, x.Reason, nil, x.Detail)
	b.Violations[len(b.Violations)-1].Advice = x.Advice
}
