package enforce

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Store is what the lock check needs of every lock store.
type Store interface {
	Status(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	Holds(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error)
}

// The lock store's optional capabilities, found once by NewLocks;
// lockstore.Store has them all.
type (
	// Confirmer: Status that does not trust a head record lagging behind
	// its claims.
	Confirmer interface {
		ConfirmedStatus(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	}
	// LockTeller: whether any lock may be held in a namespace, which
	// spares most inserts a round trip.
	LockTeller interface {
		MayHoldLocks(ns namespace.Namespace) bool
	}
	// TokenStore: HeldTokens, the lock check with the fencing tokens and
	// the lease left (the fence, the flight, a transaction's commit).
	TokenStore interface {
		HeldTokens(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error)
	}
	// TokenIntoStore: HeldTokens into the caller's slice: the usual
	// write's lock check allocates nothing.
	TokenIntoStore interface {
		HeldTokensInto(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration, tokens []int64) (time.Duration, []docid.ID, error)
	}
	// MemoStore answers a connection's repeated check of one lock from
	// the connection's memos while the store is unchanged since it filled
	// them (lockstore.HeldMemos): no key built, no shared mutex, no map,
	// the id's key compared once and, the caller's reading of the clock
	// given, no clock read.
	MemoStore interface {
		HeldTokenMemo(ms *lockstore.HeldMemos, owner *lockstore.Owner, ns namespace.Namespace, id *docid.ID, margin time.Duration, now time.Time) (time.Duration, int64, bool)
	}
	// ElsewhereFinder finds a session's lock on the same _id in another
	// namespace.
	ElsewhereFinder interface {
		HeldElsewhere(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (string, docid.ID, bool, error)
	}
)

// ErrNoTokens: a fenced rule's write cannot be checked on a lock store
// that reports no fencing tokens (fail closed).
var ErrNoTokens = fmt.Errorf("%w: this lock store cannot report fencing tokens", lockstore.ErrUnavailable)

// Locks is enforcement's lock check over one lock store, its optional
// capabilities found once (a type assertion per write is not free).
// Safe for concurrent use.
type Locks struct {
	store     Store
	tokens    TokenStore
	into      TokenIntoStore
	memo      MemoStore
	confirm   Confirmer
	teller    LockTeller
	elsewhere ElsewhereFinder
}

// NewLocks returns the lock check over s.
func NewLocks(s Store) *Locks {
	l := &Locks{store: s}
	l.tokens, _ = s.(TokenStore)
	l.into, _ = s.(TokenIntoStore)
	l.memo, _ = s.(MemoStore)
	l.confirm, _ = s.(Confirmer)
	l.teller, _ = s.(LockTeller)
	l.elsewhere, _ = s.(ElsewhereFinder)
	return l
}

// Measures reports whether the store reports the lease left and the
// fencing tokens of the locks it checks (Held.Measured).
func (l *Locks) Measures() bool { return l.tokens != nil }

// Held is what a lock check found.
type Held struct {
	// Missing are the ids not held with the margin left; none: all are.
	Missing []docid.ID
	// Measured: Left and Tokens are known (Locks.Measures), once all are
	// held.
	Measured bool
	// Left is the lease all of them surely have left, past the margin.
	Left time.Duration
	// Tokens are their fencing tokens, in the order of the ids.
	Tokens []int64
}

// Check checks that o holds every id of ns with margin left. A fenced
// write needs the tokens, so a store that cannot report them fails it
// (ErrNoTokens). The tokens go into buf when it is large enough.
func (l *Locks) Check(ctx context.Context, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration, fenced bool, buf []int64) (Held, error) {
	if l.tokens == nil {
		if fenced {
			return Held{}, ErrNoTokens
		}
		_, missing, err := l.store.Holds(ctx, *o, ns, ids, margin)
		return Held{Missing: missing}, err
	}
	if l.into != nil {
		tokens := buf[:0]
		if len(ids) > cap(buf) {
			tokens = make([]int64, 0, len(ids))
		}
		tokens = tokens[:len(ids)]
		left, missing, err := l.into.HeldTokensInto(ctx, *o, ns, ids, margin, tokens)
		return Held{Missing: missing, Measured: err == nil && len(missing) == 0, Left: left, Tokens: tokens}, err
	}
	tokens, left, missing, err := l.tokens.HeldTokens(ctx, *o, ns, ids, margin)
	return Held{Missing: missing, Measured: err == nil && len(missing) == 0, Left: left, Tokens: tokens}, err
}

// HeldMemos are a connection's memos of its latest lock checks, one per
// document, replaced in turn (lockstore.HeldMemos): a client writes a few
// documents over and over. The zero value is empty; it is the
// connection's own (not safe for concurrent use).
type HeldMemos lockstore.HeldMemos

// Check is l.Check of the one id, answered from the memo of its latest
// check, else through the memo it replaces next (filled for the next
// check when the store answers); false: ask l.Check. now is the caller's
// reading of time.Now, with nothing between it and the check that may
// wait (the answer is for that instant: Checker.Needs); the zero Time has
// the store read the clock. The token goes into buf, which must have room for one.
func (m *HeldMemos) Check(l *Locks, o *lockstore.Owner, ns namespace.Namespace, id *docid.ID, margin time.Duration, now time.Time, buf []int64) (Held, bool) {
	left, token, ok := m.Left(l, o, ns, id, margin, now)
	if !ok {
		return Held{}, false
	}
	tokens := buf[:1]
	tokens[0] = token
	return Held{Measured: true, Left: left, Tokens: tokens}, true
}

// Left is Check's answer without a Held made of it, for a caller that
// has the token's room: the lease left past the margin and the token.
// The slot is picked by the store's one lookup (lockstore.HeldMemos.Find),
// not here: picking it here compared the id's key once more.
func (m *HeldMemos) Left(l *Locks, o *lockstore.Owner, ns namespace.Namespace, id *docid.ID, margin time.Duration, now time.Time) (time.Duration, int64, bool) {
	if l.memo == nil {
		return 0, 0, false
	}
	return l.memo.HeldTokenMemo((*lockstore.HeldMemos)(m), o, ns, id, margin, now)
}

// MayHoldLocks reports whether any lock may be held in ns: true unless
// the store can tell that none is.
func (l *Locks) MayHoldLocks(ns namespace.Namespace) bool {
	return l.teller == nil || l.teller.MayHoldLocks(ns)
}

// ConfirmedStatus is the lock store's Status for decisions where "not
// held" lets a write through: it must not trust a head record that lags
// behind its claims (lockstore.Store.ConfirmedStatus). A store without the
// distinction (the in-memory one) answers Status.
func (l *Locks) ConfirmedStatus(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	if l.confirm != nil {
		return l.confirm.ConfirmedStatus(ctx, o, ns, ids)
	}
	return l.store.Status(ctx, o, ns, ids)
}

// Status is the store's Status.
func (l *Locks) Status(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	return l.store.Status(ctx, o, ns, ids)
}

// The explanations below run on the refusal path only: each says why a
// lock the caller believes it took does not cover the write, naming only
// ids the request named (the caller passes those alone).

// HeldAsOtherType finds a lock o holds on one of ids written as another
// type: "1" for 1, or 1 for "1", the usual way a lock that "was taken"
// still does not cover a write.
func (l *Locks) HeldAsOtherType(ctx context.Context, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (docid.ID, bool) {
	var alts []docid.ID
	alt := func(t bsontype.Type, b []byte) {
		if id, err := docid.New(bson.RawValue{Type: t, Value: b}); err == nil {
			alts = append(alts, id)
		}
	}
	for _, id := range ids {
		if len(alts) >= 10 {
			break
		}
		raw := id.Raw()
		switch id.Type() {
		case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
			if f, ok := raw.DoubleOK(); ok && f != math.Trunc(f) {
				continue // 1.5 has no string twin worth suggesting
			}
			if n, ok := raw.AsInt64OK(); ok {
				alt(bson.TypeString, bsoncore.AppendString(nil, strconv.FormatInt(n, 10)))
			}
		case bson.TypeString:
			if n, err := strconv.ParseInt(raw.StringValue(), 10, 64); err == nil {
				alt(bson.TypeInt64, bsoncore.AppendInt64(nil, n))
			} else if oid, err := primitive.ObjectIDFromHex(raw.StringValue()); err == nil {
				alt(bson.TypeObjectID, bsoncore.AppendObjectID(nil, oid))
			}
		case bson.TypeObjectID:
			// The other usual mix-up: the ObjectId's hex text.
			alt(bson.TypeString, bsoncore.AppendString(nil, raw.ObjectID().Hex()))
		}
	}
	if len(alts) == 0 {
		return docid.ID{}, false
	}
	sts, err := l.store.Status(ctx, *o, ns, alts)
	if err != nil {
		return docid.ID{}, false
	}
	for i, st := range sts {
		if st.HeldByYou && i < len(alts) {
			return alts[i], true
		}
	}
	return docid.ID{}, false
}

// HeldInDoubledNamespace checks the usual namespace mistake: acquireLock:
// "shop.orders" run on database shop locks shop.shop.orders. It reports
// that namespace when o holds one of ids there.
func (l *Locks) HeldInDoubledNamespace(ctx context.Context, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (string, bool) {
	if strings.IndexByte(ns.String(), '.') < 0 || len(ids) == 0 {
		return "", false
	}
	other := namespace.New(ns.DB(), ns.String())
	sts, err := l.store.Status(ctx, *o, other, ids[:min(len(ids), 10)])
	if err != nil {
		return "", false
	}
	for _, st := range sts {
		if st.HeldByYou {
			return other.String(), true
		}
	}
	return "", false
}

// HeldInOtherNamespace explains a lock taken in the wrong namespace: most
// often acquireLock run on another database than the write (mongosh
// starts on "test"), or on a misspelt collection. It returns the text to
// append to the refusal, naming a namespace o itself locked in.
func (l *Locks) HeldInOtherNamespace(ctx context.Context, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (string, bool) {
	if l.elsewhere == nil || len(ids) == 0 {
		return "", false
	}
	other, id, ok, err := l.elsewhere.HeldElsewhere(ctx, *o, ns, ids[:min(len(ids), 10)])
	if err != nil || !ok {
		return "", false
	}
	db, coll := ns.Parts()
	return fmt.Sprintf(" (it holds the lock on _id %s in %s instead: a lock covers only the namespace it was taken in; run {acquireLock: %q} on database %s)",
		id.String(), other, coll, db), true
}

// TypeName names v's type with its article, as a refusal says it.
func TypeName(v docid.ID) string {
	switch v.Type() {
	case bson.TypeString:
		return "a string"
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
		return "a number"
	case bson.TypeObjectID:
		return "an ObjectId"
	}
	return "a " + v.Type().String()
}

// Missing is the refusal of write w of ns, whose session o does not hold
// the locks it needs, saying what it can about them: shown are the
// missing ids the request named itself (the only ones a refusal shows),
// hidden the count of the others. disclose: the caller may read ns
// (authority.MayDisclose), asked before the lock store is, so that not
// even the asking depends on the answer; to any other caller a lock held
// by another session and no lock at all are the same refusal, down to
// the hints.
func (l *Locks) Missing(ctx context.Context, o *lockstore.Owner, r *policy.Rule, w policy.Write, shown []docid.ID, hidden int, disclose bool) Violation {
	ns := w.NS
	x := Violation{Rule: *r, Write: w, Reason: ReasonNotLocked, IDs: shown}
	// One more round trip, on the refusal path only, to say who holds it:
	// for a named id only, as the holder of another document is none of
	// the caller's business.
	if len(shown) > 0 {
		if sts, err := l.store.Status(ctx, *o, ns, shown[:1]); err == nil && len(sts) == 1 {
			st := sts[0]
			switch {
			case st.Held && !st.HeldByYou && disclose:
				x.Reason, x.Holder = ReasonHeldByOther, &st.Holder
			case st.HeldByYou:
				x.Detail = fmt.Sprintf("this session's lock on %s has less than the policy's margin of %s (policy.leaseMarginMS) left; renew it with renewLock", refuse.IDsString(shown), lockstore.FormatMS(r.LeaseMargin))
			case st.ForceReleased && disclose && len(shown) == 1:
				// Said to the former holder as renewLock says it: its
				// work was cut off on purpose, not by a bug of its own.
				x.Detail = fmt.Sprintf("this session does not hold the lock on %s: an operator force-released it at %s", refuse.IDsString(shown), st.UpdatedAt.UTC().Format(time.RFC3339))
				if st.ForceReason != "" {
					x.Detail += fmt.Sprintf(" (reason: %q)", st.ForceReason)
				}
			}
		}
	}
	if x.Detail != "" {
		return x
	}
	switch {
	case hidden == 0:
		x.Detail = fmt.Sprintf("this session does not hold the lock on %s", refuse.IDsString(shown))
	case len(shown) == 0:
		x.Detail = fmt.Sprintf("this session does not hold the lock on %s its filter matches", documents(hidden))
	default:
		x.Detail = fmt.Sprintf("this session does not hold the lock on %s, nor on %s more that its filter matches", refuse.IDsString(shown), documents(hidden))
	}
	if x.Holder != nil {
		if len(shown) == 1 {
			x.Detail += " (" + refuse.DescribeHolder(*x.Holder) + ")"
		} else {
			x.Detail += fmt.Sprintf(" (_id %s is %s)", shown[0], refuse.DescribeHolder(*x.Holder))
		}
	} else if alt, ok := l.HeldAsOtherType(ctx, o, ns, shown); ok {
		x.Detail += fmt.Sprintf(" (it holds the lock on _id %s, %s: an _id of another type is another document)", alt, TypeName(alt))
	} else if other, ok := l.HeldInDoubledNamespace(ctx, o, ns, shown); ok {
		x.Detail += fmt.Sprintf(" (it holds the lock in %s instead: acquireLock takes the collection name alone, run on its database)", other)
	} else if why, ok := l.HeldInOtherNamespace(ctx, o, ns, shown); ok {
		x.Detail += why
	}
	return x
}

func documents(n int) string {
	if n == 1 {
		return "1 document"
	}
	return fmt.Sprintf("%d documents", n)
}

// Insertable refuses an insert into ns of ids another session has
// locked (nil: it may go), and fails closed when the store cannot tell.
// checked: the store was asked; where no lock may be held in ns at all,
// no _id of it can be locked, and most inserts need no round trip.
//
// The locks are those of r.LockNamespace: into a case variant of a
// protected database, where no lock can be taken, the protected
// namespace's, which an upstream that folds database names writes.
func (l *Locks) Insertable(ctx context.Context, o *lockstore.Owner, r *policy.Rule, w policy.Write, ids []docid.ID) (_ *Violation, checked bool) {
	ns := r.LockNamespace(w.NS)
	if !l.MayHoldLocks(ns) {
		return nil, false
	}
	sts, err := l.ConfirmedStatus(ctx, *o, ns, ids)
	if err != nil {
		return &Violation{Rule: *r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm that the inserted _ids are unlocked (%v)", err)}, true
	}
	for _, st := range sts {
		if st.Held && !st.HeldByYou {
			h := st.Holder
			return &Violation{Rule: *r, Write: w, Reason: ReasonInsertLocked, IDs: []docid.ID{st.ID}, Holder: &h,
				Detail: fmt.Sprintf("another session has locked _id %s%s, which this insert would create (%s)", st.ID, inVariant(r, ns), refuse.DescribeHolder(h))}, true
		}
	}
	return nil, true
}

// inVariant names ns, the namespace whose locks an insert under r was
// checked against, when it is not the one written (Rule.CaseOf).
func inVariant(r *policy.Rule, ns namespace.Namespace) string {
	if r.CaseOf == "" {
		return ""
	}
	return " in " + ns.String() + ", which a server that folds database names writes under this spelling"
}

// Needs are the locks a command's writes need, by namespace in the order
// first written: a slice, as a command writes one namespace or very few.
type Needs []Need

// Need is the locks the writes of one namespace need.
type Need struct {
	NS namespace.Namespace
	// Rule is the rule of the namespace's last write: a pointer into the
	// verdict's rules, which outlive every need (a rule is too large to
	// copy on every call).
	Rule *policy.Rule
	IDs  []docid.ID
}

// Add adds ids, written under r, to ns's need.
func (n *Needs) Add(ns namespace.Namespace, r *policy.Rule, ids ...docid.ID) {
	for i := range *n {
		if (*n)[i].NS.String() == ns.String() {
			(*n)[i].Rule = r
			(*n)[i].IDs = append((*n)[i].IDs, ids...)
			return
		}
	}
	*n = append(*n, Need{NS: ns, Rule: r, IDs: slices.Clip(ids)})
}

// Checker checks that a write's session holds the locks its writes need,
// and records on the verdict what it found: the ids it verified, or the
// violation that refuses the write. V is the verdict as the caller keeps
// it, handed back to its funcs untouched. Its funcs are set once and the
// Checker shared.
type Checker[V any] struct {
	Locks *Locks
	// Skip reports whether the check of ids is left to another (the
	// implicit locks' acquire, which reads the same keys), under a rule
	// that takes implicit locks (it is asked for no other); nil: never.
	Skip func(v V, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) bool
	// Defer reports whether a write whose session lacks missing (of ids)
	// is left to implicit locks rather than refused; nil: never.
	Defer func(v V, r *policy.Rule, ns namespace.Namespace, ids, missing []docid.ID) bool
	// Held checks the locks and records what the write's flight and
	// fence need of them; nil: Locks.Check alone, unfenced.
	Held func(ctx context.Context, v V, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (ok bool, missing []docid.ID, err error)
	// MayDisclose reports whether req's caller may be told who holds a
	// lock of ns; nil: never.
	MayDisclose func(ctx context.Context, req *proxy.Request, ns namespace.Namespace) bool
	// InsertChecks counts the checks of inserted ids by outcome
	// (checked, skipped); nil: none.
	InsertChecks *prometheus.CounterVec
}

// Insertable refuses inserts of ids into ns that another session has
// locked (Locks.Insertable).
func (c *Checker[V]) Insertable(ctx context.Context, base *Verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) {
	x, checked := c.Locks.Insertable(ctx, o, r, base.FirstWrite(ns), ids)
	if c.InsertChecks != nil {
		if !checked {
			c.InsertChecks.WithLabelValues("skipped").Inc()
		} else {
			c.InsertChecks.WithLabelValues("checked").Inc()
		}
	}
	if x != nil {
		base.Violations = append(base.Violations, *x)
	}
}

// Needs checks the locks each namespace's writes need, skipping
// namespaces already refused.
//
// A check answered from a held-lock memo is for the instant base.Now
// (HeldMemos.Left: the lease and the cache's trust are measured from it,
// no clock read), so base.Now must be fresh at each such check (of a
// single id): it is read again before one unless nothing between the
// decision's start and it can have waited (startFresh). The reading is
// taken before the check, so it is never later than the check's answer,
// as the flight's measure needs (Verdict.Now).
func (c *Checker[V]) Needs(ctx context.Context, v V, base *Verdict, o *lockstore.Owner, need Needs) {
	fresh := startFresh(base, need)
	for i := range need {
		if n := &need[i]; len(n.IDs) > 0 && !base.Blocked(n.NS) {
			if len(n.IDs) == 1 && (!fresh || base.Now.IsZero()) {
				// Only a single id's check may be a memo's.
				base.Now = time.Now()
			}
			c.Check(ctx, v, base, n.Rule, o, n.NS, n.IDs)
		}
	}
}

// startFresh reports whether base.Now, read when the decision started,
// is still fresh at need's one check, of one id: nothing before it can
// have waited. That is a single write (another write's check, or the
// explanation of its refusal, can wait on the lock store), neither an
// insert nor an upsert (their checks read the lock store and the
// collection's options first), whose _id is of a type no collation
// compares (for a string, or a document or array that may hold one,
// Targets.ExactStrings may ask the resolver for the collection's
// collation). A resolution zeroes base.Now (Walk.targets). Anything else
// is read again: the trust in a cached lock is measured in milliseconds,
// and a reading older than the check by a wait would stretch it.
func startFresh(base *Verdict, need Needs) bool {
	// Several ids are never a memo's check (heldFromMemo): their freshness
	// is not asked.
	if len(base.Writes) != 1 || len(need) != 1 || len(need[0].IDs) != 1 {
		return false
	}
	if w := &base.Writes[0]; w.Kind == policy.KindInsert || w.Upsert {
		return false
	}
	t := need[0].IDs[0].Type()
	return t < 64 && uncollatedIDs>>t&1 != 0
}

// uncollatedIDs are the _id types no collation compares, as a set of bits
// (a switch over them cost a compare each on every write).
const uncollatedIDs = 1<<bson.TypeInt32 | 1<<bson.TypeInt64 | 1<<bson.TypeDouble | 1<<bson.TypeDecimal128 |
	1<<bson.TypeObjectID | 1<<bson.TypeDateTime | 1<<bson.TypeTimestamp | 1<<bson.TypeBinary | 1<<bson.TypeBoolean

// Check verifies that o holds every id in ns with the rule's margin: the
// ids are verified, left to implicit locks, or the write is refused.
func (c *Checker[V]) Check(ctx context.Context, v V, base *Verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) {
	if len(o.Session) == 0 {
		// No session: it holds nothing (only rules with implicit locks
		// get here without one). Unless implicit locks take it, it is
		// refused: a check that records nothing would allow it.
		if c.Defer == nil || !c.Defer(v, r, ns, ids, ids) {
			refuseNoSession(base, r, ns)
		}
		return
	}
	if c.Skip != nil && r.Implicit() && c.Skip(v, r, o, ns, ids) {
		return
	}
	var ok bool
	var missing []docid.ID
	var err error
	if c.Held != nil {
		ok, missing, err = c.Held(ctx, v, r, o, ns, ids)
	} else {
		var h Held
		h, err = c.Locks.Check(ctx, o, ns, ids, r.LeaseMargin, false, base.TokenBuf[:0])
		ok, missing = err == nil && len(h.Missing) == 0, h.Missing
	}
	if err != nil {
		refuseUnavailable(base, r, ns, err)
		return
	}
	if ok {
		base.Check(ns, ids)
		return
	}
	if c.Defer != nil && c.Defer(v, r, ns, ids, missing) {
		return
	}
	c.Refuse(ctx, base, r, o, ns, missing)
}

// refuseNoSession and refuseUnavailable are Check's refusals, kept out
// of it: inlined, their copies of the rule (a Violation holds one by
// value) and fmt's arguments made Check's frame about 2 KB, a stack
// every allowed write touches and that is cold between a connection's
// writes.
//
//go:noinline
func refuseNoSession(base *Verdict, r *policy.Rule, ns namespace.Namespace) {
	base.Add(*r, base.FirstWrite(ns), refuse.ReasonNoSession, nil, "the command carries no logical session (lsid), so it cannot hold locks")
}

//go:noinline
func refuseUnavailable(base *Verdict, r *policy.Rule, ns namespace.Namespace, err error) {
	base.Violations = append(base.Violations, Violation{Rule: *r, Write: base.FirstWrite(ns), Reason: refuse.ReasonUnavailable,
		Detail: fmt.Sprintf("the lock store cannot confirm the locks (%v), so the write is refused (fail closed)", err)})
}

// Refuse refuses a write of ns whose session does not hold the locks on
// missing (Locks.Missing), showing only the ids the request named.
func (c *Checker[V]) Refuse(ctx context.Context, base *Verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, missing []docid.ID) {
	var shown []docid.ID
	for _, id := range missing {
		if base.IsNamed(ns, id) {
			shown = append(shown, id)
		}
	}
	disclose := len(shown) > 0 && c.MayDisclose != nil && c.MayDisclose(ctx, base.Req, ns)
	base.Violations = append(base.Violations, c.Locks.Missing(ctx, o, r, base.FirstWrite(ns), shown, len(missing)-len(shown), disclose))
}
