package enforce

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// collatingResolver is guardtest's resolver with one collation besides
// the simple one: {locale: "en", strength: 2}, which compares strings
// without case ("a" matches "A"), as the statement's collation or as a
// collection's default. It evaluates a filter under it on a copy of the
// documents with every string folded to lower case, and maps the folded
// _ids back to the documents they came from; documents whose folded
// forms are equal must be equal apart from case (Insert checks), so a
// folded _id stands for each of them.
type collatingResolver struct {
	exact, folded *guardtest.Resolver

	mu     sync.Mutex
	calls  int
	ci     map[string]bool                  // collections whose default collation is case-insensitive
	origin map[string]map[string][]docid.ID // ns -> folded _id's key -> the _ids folded to it, in order
	bodies map[string]map[string]string     // ns -> folded _id's key -> the folded document
}

func newCollatingResolver() *collatingResolver {
	return &collatingResolver{exact: guardtest.NewResolver(), folded: guardtest.NewResolver(),
		ci: map[string]bool{}, origin: map[string]map[string][]docid.ID{}, bodies: map[string]map[string]string{}}
}

// ciCollation is the statement collation the resolver folds case under.
var ciCollation = bson.D{{Key: "locale", Value: "en"}, {Key: "strength", Value: 2}}

// fold is v with every string in lower case.
func fold(v any) any {
	switch x := v.(type) {
	case string:
		return strings.ToLower(x)
	case bson.D:
		out := make(bson.D, len(x))
		for i, e := range x {
			out[i] = bson.E{Key: e.Key, Value: fold(e.Value)}
		}
		return out
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = fold(e)
		}
		return out
	}
	return v
}

func foldDoc(d bsoncore.Document) (bson.D, error) {
	var x bson.D
	if err := bson.Unmarshal(d, &x); err != nil {
		return nil, err
	}
	return fold(x).(bson.D), nil
}

// SetCaseInsensitive gives ns the case-insensitive default collation.
func (r *collatingResolver) SetCaseInsensitive(ns string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ci[ns] = true
}

// CreateCapped makes ns a capped collection.
func (r *collatingResolver) CreateCapped(ns string) { r.exact.CreateCapped(ns) }

// Insert adds documents to ns.
func (r *collatingResolver) Insert(ns string, docs ...bson.D) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.origin[ns] == nil {
		r.origin[ns], r.bodies[ns] = map[string][]docid.ID{}, map[string]string{}
	}
	for _, d := range docs {
		if err := r.exact.Insert(ns, d); err != nil {
			return err
		}
		f := fold(d).(bson.D)
		if err := r.folded.Insert(ns, f); err != nil {
			return err
		}
		id, err := docid.Of(d[0].Value)
		if err != nil {
			return err
		}
		fid, err := docid.Of(f[0].Value)
		if err != nil {
			return err
		}
		body := fmt.Sprint(f)
		if b, ok := r.bodies[ns][fid.Key()]; ok && b != body {
			return fmt.Errorf("documents %v and %v differ in more than case", b, body)
		}
		r.bodies[ns][fid.Key()] = body
		r.origin[ns][fid.Key()] = append(r.origin[ns][fid.Key()], id)
	}
	return nil
}

// Calls returns how many times Candidates ran.
func (r *collatingResolver) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// caseInsensitive reports whether collation (else ns's default) folds
// case; an error for any collation it does not know.
func (r *collatingResolver) caseInsensitive(ns string, collation bsoncore.Document) (bool, error) {
	if collation == nil {
		return r.ci[ns], nil
	}
	locale, _ := collation.Lookup("locale").StringValueOK()
	if locale == "simple" {
		return false, nil
	}
	strength, _ := collation.Lookup("strength").AsInt64OK()
	if locale == "en" && (strength == 1 || strength == 2) {
		return true, nil
	}
	return false, fmt.Errorf("%w: collation %v", guardtest.ErrUnsupported, collation)
}

// Candidates implements Resolver.
func (r *collatingResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	r.mu.Lock()
	r.calls++
	ci, err := r.caseInsensitive(ns.String(), collation)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !ci {
		return r.exact.Candidates(ctx, ns, filter, nil, hint, limit)
	}
	f, err := foldDoc(filter)
	if err != nil {
		return nil, err
	}
	raw, err := bson.Marshal(f)
	if err != nil {
		return nil, err
	}
	ids, err := r.folded.Candidates(ctx, ns, raw, nil, hint, limit)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// The n-th match of a folded _id is the n-th document folded to it.
	seen := map[string]int{}
	out := make([]docid.ID, 0, len(ids))
	for _, id := range ids {
		all := r.origin[ns.String()][id.Key()]
		out = append(out, all[seen[id.Key()]])
		seen[id.Key()]++
	}
	return out, nil
}

// SimpleCollation implements Resolver.
func (r *collatingResolver) SimpleCollation(_ context.Context, ns namespace.Namespace) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.ci[ns.String()], nil
}

// Capped implements Resolver.
func (r *collatingResolver) Capped(ctx context.Context, ns namespace.Namespace) (bool, error) {
	return r.exact.Capped(ctx, ns)
}

var _ Resolver = (*collatingResolver)(nil)

var (
	_ HeldLister = (*memstore.Store)(nil)
	_ HeldLister = (*lockstore.Store)(nil)
)

// listCounting is a memstore that counts its MayBeHeldIn calls, or, with
// noList, a lock store that cannot list a namespace's locks at all.
type listCounting struct {
	*memstore.Store
	lists int
}

func (s *listCounting) MayBeHeldIn(ctx context.Context, ns namespace.Namespace, limit int) ([]docid.ID, bool, error) {
	s.lists++
	return s.Store.MayBeHeldIn(ctx, ns, limit)
}

// noList is a lock store with no MayBeHeldIn (the in-memory one, whose
// other capabilities it keeps but one).
type noList struct{ Store }

// unknownCollation is the collating resolver whose collation reads fail.
type unknownCollation struct{ *collatingResolver }

func (unknownCollation) SimpleCollation(context.Context, namespace.Namespace) (bool, error) {
	return false, fmt.Errorf("listCollections: connection reset")
}

// collatedWalk is enforcement's walk over store s and resolver res with
// one enforced rule (inserts: requireUnlocked, implicit locks when
// implicit), whose commands act as owner o.
func collatedWalk(s Store, res Resolver, o lockstore.Owner) func(t *testing.T, body bson.D) (proxy.Decision, *Violation) {
	return collatedWalkUnder(s, res, o, policy.Rule{Mode: policy.Enforce, MaxCandidates: 10, Inserts: policy.InsertsRequireUnlocked})
}

// collatedWalkUnder is collatedWalk under rule r; an insert an implicit
// lock would take is taken for held (the guard's implicit locks are not
// enforce's).
func collatedWalkUnder(s Store, res Resolver, o lockstore.Owner, r policy.Rule) func(t *testing.T, body bson.D) (proxy.Decision, *Violation) {
	return walkOf(s, res, o, func(namespace.Namespace) policy.Rule { return r }, "shop")
}

// walkOf is collatedWalk with the rule of each namespace from rules, and
// commands on database db.
func walkOf(s Store, res Resolver, o lockstore.Owner, rules func(namespace.Namespace) policy.Rule, db string) func(t *testing.T, body bson.D) (proxy.Decision, *Violation) {
	targets := NewTargets(TargetsConfig{Resolver: res, ResolveTimeout: time.Minute, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)},
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	var enforced *Violation
	launched := false
	k := testWalk(targets, s, &o, rules, &Decider[*Verdict]{
		Record: func(_ *proxy.Request, _ *policy.Policy, _ *Verdict, x *Violation, _ time.Duration, _ time.Time) *Violation {
			enforced = x
			return nil
		},
		Launch: func(*proxy.Request, *policy.Policy, *Verdict, time.Time, *proxy.Decision) {
			launched = true
		}})
	// Inserts take no implicit lock here.
	k.ImplicitInsert = func(*Verdict, namespace.Namespace, *policy.Rule, docid.ID) {}
	return func(t *testing.T, body bson.D) (proxy.Decision, *Violation) {
		t.Helper()
		enforced, launched = nil, false
		req := request(t, append(body, bson.E{Key: "$db", Value: db}, formLSID))
		writes, err := policy.NewPlan(req.Message, req.Command).Writes()
		if err != nil {
			t.Fatal(err)
		}
		d := k.Run(context.Background(), req, &policy.Policy{}, writes, time.Now())
		if (d.Action == proxy.Forward) != launched {
			t.Fatalf("action %v, launched %v", d.Action, launched)
		}
		return d, enforced
	}
}

func insertOf(v any) bson.D {
	return bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: v}, {Key: "n", Value: 1}}}}}
}

// upsertOf is an update of _id v that inserts it when nothing matches,
// under the statement's collation when one is given.
func upsertOf(v any, collation ...bson.D) bson.D {
	u := bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: v}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}, {Key: "upsert", Value: true}}
	for _, c := range collation {
		u = append(u, bson.E{Key: "collation", Value: c})
	}
	return bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{u}}}
}

// TestInsertOfACaseVariantOfALockedID: in a collection whose default
// collation ignores case, its _id index does too, so "C" and "c" are one
// document's _id to the database. Session B (2) locks "c" to create it
// (lock, then upsert); a writer without that lock inserts {_id: "C"}
// first. Compared exactly, "C" is unlocked; inserts: requireUnlocked must
// refuse it all the same (docs/SECURITY.md, "Insert the _id another
// session has locked"), as the document B locked would then exist with
// the other writer's content. So must an upsert of "C" by a session (1)
// that locked "C", which inserts it when nothing matches. The check
// cannot evaluate the collation (the fake folds case; the proxy would
// need ICU), so any lock on a string _id by another session refuses a
// string _id's insert there. It failed on the code before the check.
func TestInsertOfACaseVariantOfALockedID(t *testing.T) {
	ci := newCollatingResolver()
	ci.SetCaseInsensitive("shop.orders")
	sc := newCollatingResolver() // shop.orders under the simple collation
	for _, c := range []struct {
		name string
		res  Resolver
		// mine and others' are the _ids of shop.orders the writer (1) and
		// another session (2) hold.
		mine, others []any
		body         bson.D
		refused      string // "" allowed
		lists        bool   // the lock store is asked for the namespace's locks
	}{
		{"insert of \"C\" while another holds \"c\"", ci, nil, []any{"c"}, insertOf("C"), ReasonInsertLocked, true},
		{"upsert of \"C\", held, while another holds \"c\"", ci, []any{"C"}, []any{"c"}, upsertOf("C"), ReasonInsertLocked, true},
		{"upsert of \"C\" under the simple collation, while another holds \"c\": the _id index still ignores case", ci, []any{"C"}, []any{"c"},
			upsertOf("C", bson.D{{Key: "locale", Value: "simple"}}), ReasonInsertLocked, true},
		{"insert of {a: \"C\"} while another holds {a: \"c\"}", ci, nil, []any{bson.D{{Key: "a", Value: "c"}}}, insertOf(bson.D{{Key: "a", Value: "C"}}), ReasonInsertLocked, true},
		{"insert of \"x\" while another holds \"c\": lockgate cannot tell what the collation equates", ci, nil, []any{"c"}, insertOf("x"), ReasonInsertLocked, true},
		{"insert of \"C\" while this session holds \"c\"", ci, []any{"c"}, nil, insertOf("C"), "", true},
		{"insert of \"C\" while another holds 7 and {a: 1}: no string", ci, nil, []any{7, bson.D{{Key: "a", Value: 1}}}, insertOf("C"), "", true},
		{"insert of {a: \"C\"} while another holds {b: \"c\"}: another shape", ci, nil, []any{bson.D{{Key: "b", Value: "c"}}}, insertOf(bson.D{{Key: "a", Value: "C"}}), "", true},
		{"insert of 7 while another holds \"c\": no string inserted", ci, nil, []any{"c"}, insertOf(7), "", false},
		{"upsert of 7, held, while another holds \"c\"", ci, []any{7}, []any{"c"}, upsertOf(7), "", false},
		{"insert of \"C\" under the simple collation while another holds \"c\"", sc, nil, []any{"c"}, insertOf("C"), "", false},
		{"upsert of \"C\" under a case-insensitive statement collation, simple default, while another holds \"c\": the _id index is exact",
			sc, []any{"C"}, []any{"c"}, upsertOf("C", ciCollation), "", false},
		{"insert of \"C\" where the collation cannot be read, while another holds \"c\"", unknownCollation{sc}, nil, []any{"c"}, insertOf("C"), ReasonInsertLocked, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &listCounting{Store: memstore.New(memstore.Config{})}
			for _, v := range c.mine {
				acquire(t, s.Store, ownerOf(1), "shop.orders", id(t, v))
			}
			for _, v := range c.others {
				acquire(t, s.Store, ownerOf(2), "shop.orders", id(t, v))
			}
			acquire(t, s.Store, ownerOf(2), "shop.invoices", id(t, "z"))
			d, x := collatedWalk(s, c.res, ownerOf(1))(t, c.body)
			switch {
			case c.refused == "" && d.Action != proxy.Forward:
				t.Fatalf("refused (%+v), want allowed", x)
			case c.refused != "" && (d.Action != proxy.Reply || x == nil || x.Reason != c.refused):
				t.Fatalf("action %v, violation %+v; want refused %s", d.Action, x, c.refused)
			case (s.lists > 0) != c.lists:
				t.Fatalf("the lock store listed the namespace's locks %d times, want it to: %v", s.lists, c.lists)
			}
			if x == nil {
				return
			}
			// The refusal names the _id the request names, and the holder
			// (which the guard hides from who may not read the
			// namespace), never the locked _id, which the request did not
			// name.
			for _, v := range c.others {
				if o, ok := v.(string); ok && strings.Contains(x.Detail, fmt.Sprintf("%q", o)) {
					t.Fatalf("the refusal %q names another session's locked _id %q", x.Detail, o)
				}
			}
			if len(x.IDs) != 1 || x.Holder == nil || Undisclosed(*x).Holder != nil {
				t.Fatalf("the refusal shows _ids %v, holder %v; want the inserted _id and the holder", x.IDs, x.Holder)
			}
		})
	}
}

// TestCollatedInsertUnderImplicitLocks: under unlockedWriters the insert
// of "C" takes an implicit lock on "C", which another session's lock on
// "c" does not stop (the keys differ); the collation check refuses it as
// without implicit locks.
func TestCollatedInsertUnderImplicitLocks(t *testing.T) {
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, "c"))
	r := policy.Rule{Mode: policy.Enforce, MaxCandidates: 10, Inserts: policy.InsertsRequireUnlocked, Unlocked: config.UnlockedRefuseIfLocked}
	if !r.Implicit() {
		t.Fatal("the rule takes no implicit locks")
	}
	if d, x := collatedWalkUnder(s, res, ownerOf(1), r)(t, insertOf("C")); d.Action != proxy.Reply || x == nil || x.Reason != ReasonInsertLocked {
		t.Fatalf("action %v, violation %+v; want refused %s", d.Action, x, ReasonInsertLocked)
	}
}

// TestCollatedInsertFailsClosed: where a collation may equate string _ids,
// the insert of one is refused when the lock store cannot list the
// namespace's locks (it has no such query, or it is down), or when more
// are locked there than the check reads; not once the locks are gone.
func TestCollatedInsertFailsClosed(t *testing.T) {
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	s := memstore.New(memstore.Config{})
	locks := acquire(t, s, ownerOf(2), "shop.orders", id(t, "c"))
	if d, x := collatedWalk(noList{s}, res, ownerOf(1))(t, insertOf("C")); d.Action != proxy.Reply || x == nil || x.Reason != refuse.ReasonUnavailable {
		t.Fatalf("a lock store that cannot list the namespace's locks: action %v, violation %+v; want refused %s", d.Action, x, refuse.ReasonUnavailable)
	}
	s.SetUnavailable(fmt.Errorf("down"))
	if d, x := collatedWalk(s, res, ownerOf(1))(t, insertOf("C")); d.Action != proxy.Reply || x == nil || x.Reason != refuse.ReasonUnavailable {
		t.Fatalf("a lock store that is down: action %v, violation %+v; want refused %s", d.Action, x, refuse.ReasonUnavailable)
	}
	s.SetUnavailable(nil)
	if _, err := s.Release(context.Background(), ownerOf(2), namespace.Of("shop.orders"), []docid.ID{locks[0].ID}, ""); err != nil {
		t.Fatal(err)
	}
	var many []docid.ID
	for i := range MaxCollatedLocks + 1 {
		many = append(many, id(t, i))
	}
	acquire(t, s, ownerOf(2), "shop.orders", many...)
	if d, x := collatedWalk(s, res, ownerOf(1))(t, insertOf("C")); d.Action != proxy.Reply || x == nil || x.Reason != ReasonInsertLocked {
		t.Fatalf("more than %d locks held: action %v, violation %+v; want refused %s", MaxCollatedLocks, d.Action, x, ReasonInsertLocked)
	}
	if _, err := s.ReleaseAll(context.Background(), ownerOf(2), namespace.Of("shop.orders"), ""); err != nil {
		t.Fatal(err)
	}
	if d, x := collatedWalk(s, res, ownerOf(1))(t, insertOf("C")); d.Action != proxy.Forward {
		t.Fatalf("no lock held: refused %+v", x)
	}
}

// TestStringBearingAndShape: the values a collation can take for an _id
// of other bytes, and the shape two such _ids share.
func TestStringBearingAndShape(t *testing.T) {
	val := func(v any) bsoncore.Value {
		typ, data, err := bson.MarshalValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return bsoncore.Value{Type: typ, Data: data}
	}
	for _, c := range []struct {
		v    any
		want bool
	}{
		{"c", true}, {primitive.Symbol("c"), true}, {bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: "x"}}}}, true},
		{primitive.CodeWithScope{Code: "f", Scope: bson.D{{Key: "a", Value: "x"}}}, true},
		{7, false}, {bson.D{{Key: "a", Value: 1}}, false}, {primitive.NewObjectID(), false}, {primitive.JavaScript("x"), false},
	} {
		if got := StringBearing(val(c.v)); got != c.want {
			t.Errorf("StringBearing(%v) = %v, want %v", c.v, got, c.want)
		}
	}
	same := func(a, b any) bool {
		ka, err := shapeKey(val(a))
		if err != nil {
			t.Fatal(err)
		}
		kb, err := shapeKey(val(b))
		if err != nil {
			t.Fatal(err)
		}
		return ka == kb
	}
	for _, c := range []struct {
		a, b any
		want bool
	}{
		{"C", "c", true}, {"C", "straße", true}, {"C", primitive.Symbol("c"), true},
		{bson.D{{Key: "a", Value: "C"}, {Key: "n", Value: 1}}, bson.D{{Key: "a", Value: "c"}, {Key: "n", Value: 1.0}}, true},
		{bson.D{{Key: "a", Value: "C"}, {Key: "n", Value: 1}}, bson.D{{Key: "a", Value: "c"}, {Key: "n", Value: 2}}, false},
		{bson.D{{Key: "a", Value: "C"}}, bson.D{{Key: "A", Value: "c"}}, false},
		{"C", bson.D{{Key: "a", Value: "c"}}, false},
	} {
		if got := same(c.a, c.b); got != c.want {
			t.Errorf("one shape (%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// collatedFaults is a memstore whose listing of a namespace's locks, or
// whose confirmed status, fails when set.
type collatedFaults struct {
	*memstore.Store
	listErr, confirmErr error
}

func (s collatedFaults) MayBeHeldIn(ctx context.Context, ns namespace.Namespace, limit int) ([]docid.ID, bool, error) {
	if s.listErr != nil {
		return nil, false, s.listErr
	}
	return s.Store.MayBeHeldIn(ctx, ns, limit)
}

func (s collatedFaults) ConfirmedStatus(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	if s.confirmErr != nil {
		return nil, s.confirmErr
	}
	return s.Store.Status(ctx, o, ns, ids)
}

// TestCollatedCheckFailsClosed: the collation check of an insert of "C",
// where another session holds "c", refuses it as unavailable when the
// lock store cannot list the namespace's locks, or cannot confirm the
// candidates it listed. Mutants: CollatedInsertable ignoring either
// error (the insert went through).
func TestCollatedCheckFailsClosed(t *testing.T) {
	s := memstore.New(memstore.Config{})
	a := ownerOf(1)
	acquire(t, s, ownerOf(2), "shop.orders", id(t, "c"))
	r := policy.Rule{Mode: policy.Enforce, Inserts: policy.InsertsRequireUnlocked}
	w := policy.Write{NS: namespace.Of("shop.orders"), Kind: policy.KindInsert}
	ids := []docid.ID{id(t, "C")}
	if x := NewLocks(collatedFaults{Store: s}).CollatedInsertable(t.Context(), &a, &r, w, ids); x == nil || x.Reason != ReasonInsertLocked {
		t.Fatalf("the store answering: %+v; want %s", x, ReasonInsertLocked)
	}
	for what, st := range map[string]collatedFaults{
		"listing":    {Store: s, listErr: errors.New("list failed")},
		"confirming": {Store: s, confirmErr: errors.New("confirm failed")},
	} {
		if x := NewLocks(st).CollatedInsertable(t.Context(), &a, &r, w, ids); x == nil || x.Reason != refuse.ReasonUnavailable {
			t.Errorf("%s failed: %+v; want refused as unavailable", what, x)
		}
	}
}

// TestCommitCollatedOneString: a transaction's commit that inserts one
// string _id into a namespace that ignores case is refused when another
// session has since locked its case variant. Mutant: CommitCollated
// checking only two or more string _ids.
func TestCommitCollatedOneString(t *testing.T) {
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, "c"))
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	f := newTargets(t, true)
	f.targets.cfg.Resolver = res
	if why := CommitCollated(t.Context(), f.targets, NewLocks(s), ownerOf(1), namespace.Of("shop.orders"), []docid.ID{id(t, "C")}); why == "" {
		t.Fatal("commit of an insert of \"C\" while another holds \"c\": allowed")
	}
	if why := CommitCollated(t.Context(), f.targets, NewLocks(s), ownerOf(1), namespace.Of("shop.orders"), []docid.ID{id(t, 7)}); why != "" {
		t.Fatalf("commit of an insert of 7: %s", why)
	}
}

// TestCollatedInsertForms: the collation check covers each insert whose
// _id holds a string, whatever the type that holds it, every one of a
// command's inserts, and an insert into a case variant of the protected
// database on a store that tells where locks may be held. Mutants:
// Collatable without the symbol, or without code with scope; collated
// keeping one _id per namespace; collated asking MayHoldLocks of the
// namespace written, not the one whose locks apply.
func TestCollatedInsertForms(t *testing.T) {
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	cws := func(s string) primitive.CodeWithScope {
		return primitive.CodeWithScope{Code: "f", Scope: bson.D{{Key: "a", Value: s}}}
	}
	two := bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: bson.A{
		bson.D{{Key: "_id", Value: bson.D{{Key: "a", Value: "C"}}}}, bson.D{{Key: "_id", Value: "x"}}}}}
	for _, c := range []struct {
		name  string
		db    string
		other any // the _id of shop.orders another session holds
		body  bson.D
	}{
		{"insert of the symbol \"C\" while another holds \"c\"", "shop", "c", insertOf(primitive.Symbol("C"))},
		{"insert of code with scope {a: \"C\"} while another holds it with {a: \"c\"}", "shop", cws("c"), insertOf(cws("C"))},
		{"insert of {a: \"C\"} and \"x\" while another holds {a: \"c\"}", "shop", bson.D{{Key: "a", Value: "c"}}, two},
		{"insert of \"C\" into SHOP.orders while another holds \"c\" in shop.orders", "SHOP", "c", insertOf("C")},
	} {
		t.Run(c.name, func(t *testing.T) {
			// memstore tells where no lock may be held, as lockstore.Store
			// does (LockTeller), so a check asked of the wrong namespace
			// is skipped there, as in production.
			s := memstore.New(memstore.Config{})
			acquire(t, s, ownerOf(2), "shop.orders", id(t, c.other))
			rules := func(namespace.Namespace) policy.Rule {
				return policy.Rule{Mode: policy.Enforce, MaxCandidates: 10, Inserts: policy.InsertsRequireUnlocked}
			}
			if c.db != "shop" {
				pol := compileOrders(t)
				rules = func(ns namespace.Namespace) policy.Rule { return pol.Lookup(ns) }
			}
			d, x := walkOf(s, res, ownerOf(1), rules, c.db)(t, c.body)
			if d.Action != proxy.Reply || x == nil || x.Reason != ReasonInsertLocked {
				t.Fatalf("action %v, violation %+v; want refused %s", d.Action, x, ReasonInsertLocked)
			}
		})
	}
}

// compileOrders is the policy of TestInsertIntoACaseVariantOfALockedID:
// shop.orders enforced, nothing else.
func compileOrders(t *testing.T) *policy.Policy {
	return compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
}
