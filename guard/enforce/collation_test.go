package enforce

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
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

// TestInsertOfACaseVariantOfALockedID is a known gap, skipped unless
// LOCKGATE_KNOWN_GAPS=1: in a collection whose default collation ignores
// case, its _id index does too, so "C" and "c" are one document's _id to
// the database. Session B locks "c" to create it (lock, then upsert); a
// writer without that lock inserts {_id: "C"} first. The insert check
// compares lock keys exactly, finds "C" unlocked and lets the insert
// through (inserts: requireUnlocked should refuse it: docs/SECURITY.md,
// "Insert the _id another session has locked"); the document B locked
// now exists with the other writer's content, and B's upsert of "c"
// matches "C", whose lock it does not hold. It fails on the code as it
// is.
func TestInsertOfACaseVariantOfALockedID(t *testing.T) {
	if os.Getenv("LOCKGATE_KNOWN_GAPS") == "" {
		t.Skip("known gap (collation-equal string _ids at insert); LOCKGATE_KNOWN_GAPS=1 runs it")
	}
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, "c"))
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	targets := NewTargets(TargetsConfig{Resolver: res, ResolveTimeout: time.Minute, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)},
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	launched := false
	k := &Walk[*Verdict]{Targets: targets, Checker: &Checker[*Verdict]{Locks: NewLocks(s)},
		Rules: func(*policy.Policy, *proxy.Request, namespace.Namespace) []policy.Rule {
			return []policy.Rule{{Mode: policy.Enforce, MaxCandidates: 10, Inserts: policy.InsertsRequireUnlocked}}
		},
		New: func(req *proxy.Request, start time.Time) (*Verdict, *Verdict) {
			v := &Verdict{Req: req, Now: start}
			return v, v
		},
		Owner: func(*proxy.Request, *Verdict) (lockstore.Owner, bool) { return ownerOf(1), true },
		Decider: &Decider[*Verdict]{
			Record: func(*proxy.Request, *policy.Policy, *Verdict, *Violation, time.Duration, time.Time) *Violation {
				return nil
			},
			Launch: func(*proxy.Request, *policy.Policy, *Verdict, time.Time) proxy.Decision {
				launched = true
				return proxy.Decision{Action: proxy.Forward}
			}}}
	req := request(t, bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: "C"}}}},
		{Key: "$db", Value: "shop"}, formLSID})
	writes, err := policy.NewPlan(req.Message, req.Command).Writes()
	if err != nil {
		t.Fatal(err)
	}
	if d := k.Run(context.Background(), req, &policy.Policy{}, writes, time.Now()); d.Action != proxy.Reply || launched {
		t.Fatalf(`an insert of "C" while another session holds "c", in a collection whose _ids ignore case: action %v, launched %v; want refused (insert_locked)`, d.Action, launched)
	}
}
