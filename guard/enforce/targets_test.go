package enforce

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// fakeThrottle is a throttle whose state the test sets.
type fakeThrottle struct {
	cooling, wait time.Duration
	slots         chan struct{}
	outcomes      []error
}

func (f *fakeThrottle) Cooling(*proxy.Request) time.Duration       { return f.cooling }
func (f *fakeThrottle) Tarpit(context.Context, *proxy.Request)     {}
func (f *fakeThrottle) RefusedWait(*proxy.Request) time.Duration   { return f.wait }
func (f *fakeThrottle) HoldRefusal(context.Context, time.Duration) {}
func (f *fakeThrottle) Slots(*proxy.Request) chan struct{}         { return f.slots }
func (f *fakeThrottle) Outcome(_ *proxy.Request, _ policy.Rule, err error) {
	f.outcomes = append(f.outcomes, err)
}

type targetsFixture struct {
	t        *testing.T
	res      *guardtest.Resolver
	throttle *fakeThrottle
	resolves *prometheus.CounterVec
	targets  *Targets
}

func newTargets(t *testing.T, withResolver bool) *targetsFixture {
	f := &targetsFixture{t: t, res: guardtest.NewResolver(), throttle: &fakeThrottle{slots: make(chan struct{}, 1)},
		resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"})}
	cfg := TargetsConfig{ResolveTimeout: time.Second, Authority: authority.New(nil), Throttle: f.throttle,
		Resolves: f.resolves, Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})}
	if withResolver {
		cfg.Resolver = f.res
	}
	f.targets = NewTargets(cfg)
	return f
}

func raw(t *testing.T, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func update(t *testing.T, filter bson.D) policy.Write {
	return policy.Write{NS: namespace.Of("shop.orders"), Kind: policy.KindUpdate, List: "updates", Filter: raw(t, filter),
		Update: bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: raw(t, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}})}}
}

func (f *targetsFixture) of(r policy.Rule, w policy.Write, resolve, refused bool) Target {
	var buf [1]bsoncore.Value
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
	var x Target
	f.targets.Of(context.Background(), req, &r, &w, resolve, refused, buf[:0], &x)
	return x
}

func sameIDs(t *testing.T, what string, got []docid.ID, want ...any) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: ids %v, want %v", what, got, want)
	}
	for i, w := range want {
		if !got[i].Equal(id(t, w)) {
			t.Fatalf("%s: ids %v, want %v", what, got, want)
		}
	}
}

var enforced = policy.Rule{Mode: policy.Enforce, MaxCandidates: 3}

// TestTargetsPinned: a filter that pins _id names its targets without a
// resolution, within the rule's maxCandidates; a pinned string _id under
// a collation that is not simple must be resolved instead.
func TestTargetsPinned(t *testing.T) {
	f := newTargets(t, true)
	x := f.of(enforced, update(t, bson.D{{Key: "_id", Value: 7}}), false, false)
	if !x.OK || x.Reason != "" || x.Resolved || x.Pins {
		t.Fatalf("pinned: %+v", x)
	}
	sameIDs(t, "pinned", x.IDs, 7)
	sameIDs(t, "named", x.Pinned, 7)

	x = f.of(enforced, update(t, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{1, 2, 3}}}}}), false, false)
	sameIDs(t, "$in", x.IDs, 1, 2, 3)

	x = f.of(enforced, update(t, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{1, 2, 3, 4}}}}}), false, false)
	if x.OK || x.Reason != ReasonTooManyCandidates {
		t.Fatalf("over maxCandidates: %+v", x)
	}

	f.res.SetCollation("shop.orders", "en")
	x = f.of(enforced, update(t, bson.D{{Key: "_id", Value: "abc"}}), false, false)
	if !x.Later {
		t.Fatalf("a string _id under a case-folding collation was taken as pinned: %+v", x)
	}
	w := update(t, bson.D{{Key: "_id", Value: "abc"}})
	w.Collation = raw(t, bson.D{{Key: "locale", Value: "simple"}})
	if x := f.of(enforced, w, false, false); !x.OK || x.Resolved {
		t.Fatalf("a string _id under the statement's simple collation: %+v", x)
	}
	if f.res.Calls() != 0 {
		t.Fatalf("%d resolutions for pinned writes", f.res.Calls())
	}
}

// TestTargetsResolved: a filter that names no _id is resolved through
// the resolver (and the statement pinned to what it found, none
// included), refused without one, when it fails, when it matches too
// many, during a cool-down or out of budget, and skipped where the
// namespace is refused already.
func TestTargetsResolved(t *testing.T) {
	f := newTargets(t, true)
	if err := f.res.Insert("shop.orders", bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: "open"}}, bson.D{{Key: "_id", Value: 2}, {Key: "s", Value: "open"}},
		bson.D{{Key: "_id", Value: 3}, {Key: "s", Value: "done"}}); err != nil {
		t.Fatal(err)
	}
	open := update(t, bson.D{{Key: "s", Value: "open"}})

	if x := f.of(enforced, open, false, false); !x.Later || x.OK {
		t.Fatalf("not yet to resolve: %+v", x)
	}
	x := f.of(enforced, open, true, false)
	if !x.OK || !x.Resolved || !x.Pins || x.Pinned != nil || len(x.Pin.IDs) != 2 {
		t.Fatalf("resolved: %+v", x)
	}
	sameIDs(t, "resolved", x.IDs, 1, 2)

	x = f.of(enforced, update(t, bson.D{{Key: "s", Value: "none"}}), true, false)
	if !x.OK || !x.Pins || len(x.IDs) != 0 {
		t.Fatalf("a filter that matches nothing must be pinned to nothing: %+v", x)
	}
	if x := f.of(policy.Rule{Mode: policy.Audit, MaxCandidates: 3}, open, true, false); !x.OK || x.Pins {
		t.Fatalf("an audited write is not pinned: %+v", x)
	}

	if x := f.of(policy.Rule{Mode: policy.Enforce, MaxCandidates: 1}, open, true, false); x.OK || x.Reason != ReasonTooManyCandidates {
		t.Fatalf("too many: %+v", x)
	}
	calls := f.res.Calls()
	if x := f.of(enforced, open, true, true); x.OK || x.Reason != "" || f.res.Calls() != calls {
		t.Fatalf("refused already: %+v, %d resolutions", x, f.res.Calls()-calls)
	}
	if got := testutil.ToFloat64(f.resolves.WithLabelValues("skipped")); got != 1 {
		t.Fatalf("skipped resolutions counted %v", got)
	}

	f.throttle.cooling = 3 * time.Second
	if x := f.of(enforced, open, true, false); x.OK || x.Reason != ReasonResolveFailed || x.Advice == "" || !strings.Contains(x.Detail, "too slow") {
		t.Fatalf("cooling down: %+v", x)
	}
	f.throttle.cooling, f.throttle.wait = 0, time.Second
	if x := f.of(enforced, open, true, false); x.OK || x.Reason != ReasonResolveFailed || !strings.Contains(x.Detail, "client address") {
		t.Fatalf("out of budget: %+v", x)
	}
	f.throttle.wait = 0
	if f.res.Calls() != calls {
		t.Fatal("a throttled write was resolved")
	}

	f.res.SetUnavailable(errors.New("down"))
	if x := f.of(enforced, open, true, false); x.OK || x.Reason != ReasonResolveFailed || !strings.Contains(x.Detail, "down") {
		t.Fatalf("resolver down: %+v", x)
	}
	if n := len(f.throttle.outcomes); n == 0 || f.throttle.outcomes[n-1] == nil {
		t.Fatal("the failed resolution was not fed to the throttle")
	}

	// Every slot busy: an audited write does not wait for one.
	f.res.SetUnavailable(nil)
	f.throttle.slots <- struct{}{}
	if x := f.of(policy.Rule{Mode: policy.Audit, MaxCandidates: 3}, open, true, false); x.OK || x.Reason != ReasonUnverified {
		t.Fatalf("audited, slots busy: %+v", x)
	}
	<-f.throttle.slots

	g := newTargets(t, false)
	if x := g.of(enforced, open, false, false); x.OK || x.Later || x.Reason != ReasonResolveFailed {
		t.Fatalf("no resolver: %+v", x)
	}
}

// TestTargetsUpsert: an upsert needs the lock of the _id it would insert
// too, and one whose _id cannot be known is refused.
func TestTargetsUpsert(t *testing.T) {
	f := newTargets(t, true)
	w := update(t, bson.D{{Key: "_id", Value: 7}})
	w.Upsert = true
	x := f.of(enforced, w, false, false)
	if !x.OK || !x.HasUpserted || !x.Upserted.Equal(id(t, 7)) {
		t.Fatalf("pinned upsert: %+v", x)
	}
	w = update(t, bson.D{{Key: "s", Value: "x"}})
	w.Upsert = true
	w.Update = bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: raw(t, bson.D{{Key: "$set", Value: bson.D{{Key: "_id", Value: 9}}}})}
	x = f.of(enforced, w, true, false)
	if !x.OK || !x.HasUpserted {
		t.Fatalf("upsert setting _id: %+v", x)
	}
	sameIDs(t, "upsert setting _id", x.IDs, 9)
	w.Update = bsoncore.Value{Type: bson.TypeArray, Data: raw(t, bson.D{{Key: "0", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}})}
	if x := f.of(enforced, w, true, false); x.OK || x.Reason != ReasonUnverifiableUpsert {
		t.Fatalf("pipeline upsert: %+v", x)
	}
}

// TestTargetsCapped: an insert into a capped collection is refused unless
// the rule allows it, and where whether it is capped cannot be told.
func TestTargetsCapped(t *testing.T) {
	f := newTargets(t, true)
	f.res.CreateCapped("shop.log")
	w := policy.Write{NS: namespace.Of("shop.log"), Kind: policy.KindInsert}
	if reason, _ := f.targets.Capped(context.Background(), &enforced, w); reason != ReasonCappedInsert {
		t.Fatalf("capped: %q", reason)
	}
	allow := enforced
	allow.AllowCappedInserts = true
	if reason, _ := f.targets.Capped(context.Background(), &allow, w); reason != "" {
		t.Fatalf("allowed: %q", reason)
	}
	if reason, _ := f.targets.Capped(context.Background(), &enforced, policy.Write{NS: namespace.Of("shop.orders")}); reason != "" {
		t.Fatalf("not capped: %q", reason)
	}
	g := newTargets(t, false)
	if reason, _ := g.targets.Capped(context.Background(), &enforced, w); reason != ReasonResolveFailed {
		t.Fatalf("no resolver: %q", reason)
	}
}

// TestCappedUnreadableFailsClosed: an insert into a collection whose
// options cannot be read is refused, as it might be capped and evict
// locked documents. Mutant: Targets.Capped ignoring the resolver's error
// (case err != nil never taken): the insert went through.
func TestCappedUnreadableFailsClosed(t *testing.T) {
	f := newTargets(t, true)
	f.res.SetUnavailable(errors.New("listCollections: connection reset"))
	w := policy.Write{NS: namespace.Of("shop.log"), Kind: policy.KindInsert}
	if reason, detail := f.targets.Capped(context.Background(), &enforced, w); reason != ReasonResolveFailed {
		t.Fatalf("capped unreadable: %q %q; want %s", reason, detail, ReasonResolveFailed)
	}
}

// TestStringPinWithoutResolver: without a resolver the collection's
// collation cannot be read, so a pinned string _id ("a" may match "A")
// is not taken as exact: the write is refused, not checked against the
// lock of "a" alone. Mutant: ExactStrings answering true without a
// resolver.
func TestStringPinWithoutResolver(t *testing.T) {
	g := newTargets(t, false)
	x := g.of(enforced, update(t, bson.D{{Key: "_id", Value: "a"}}), true, false)
	if x.OK || x.Reason != ReasonResolveFailed {
		t.Fatalf("a string _id with no resolver to read the collation: %+v; want %s", x, ReasonResolveFailed)
	}
	w := update(t, bson.D{{Key: "_id", Value: "a"}})
	w.Collation = raw(t, bson.D{{Key: "locale", Value: "simple"}})
	if x := g.of(enforced, w, true, false); !x.OK {
		t.Fatalf("a string _id under the statement's own simple collation: %+v", x)
	}
}

// TestResolutionAsksTheCallersReadAccess: where the upstream requires
// authentication, a filter that names no _id is resolved for a caller
// only once the upstream said the caller may read the namespace: one who
// may not, or whose access could not be asked, is refused and nothing is
// resolved. Mutants: MayRead not asking (Required ignored), ignoring a
// no, ignoring an error.
func TestResolutionAsksTheCallersReadAccess(t *testing.T) {
	f := newTargets(t, true)
	f.targets = NewTargets(TargetsConfig{Resolver: f.res, ResolveTimeout: time.Second, Authority: authority.New(func() bool { return true }),
		Throttle: f.throttle, Resolves: f.resolves, Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	if err := f.res.Insert("shop.orders", bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: "open"}}); err != nil {
		t.Fatal(err)
	}
	open := update(t, bson.D{{Key: "s", Value: "open"}})
	of := func(c *proxy.ClientInfo) Target {
		var x Target
		r := enforced
		f.targets.Of(t.Context(), &proxy.Request{Client: c}, &r, &open, true, false, nil, &x)
		return x
	}
	key := string(authority.Read) + " shop.orders"

	denied := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	denied.SetVerdict(key, false)
	if x := of(denied); x.OK || x.Reason != ReasonResolveFailed || !strings.Contains(x.Detail, "may not read") {
		t.Fatalf("a caller who may not read shop.orders: %+v", x)
	}
	// No connection to ask on (proxy.ErrNoUpstream): not asked is not yes.
	unasked := &proxy.ClientInfo{ID: 2, Addr: "127.0.0.1:5001"}
	if x := of(unasked); x.OK || x.Reason != ReasonResolveFailed || !strings.Contains(x.Detail, "could not be asked") {
		t.Fatalf("a caller whose read access could not be asked: %+v", x)
	}
	if n := f.res.Calls(); n != 0 {
		t.Fatalf("%d resolutions for callers who may not read", n)
	}
	allowed := &proxy.ClientInfo{ID: 3, Addr: "127.0.0.1:5002"}
	allowed.SetVerdict(key, true)
	if x := of(allowed); !x.OK || !x.Resolved {
		t.Fatalf("a caller who may read shop.orders: %+v", x)
	}
}

// TestResolvedWriteIsPinned: an enforced write whose filter was resolved
// is allowed only with its statement pinned to the documents the
// resolution found (the verdict's Pins, which the guard's edit writes
// into the forwarded statement), so that it cannot touch a document
// that came to match after its locks were checked. Mutant: targetsFound not recording the pin
// (the write was forwarded as sent).
func TestResolvedWriteIsPinned(t *testing.T) {
	s := memstore.New(memstore.Config{})
	o := ownerOf(1)
	acquire(t, s, o, "shop.orders", id(t, 1), id(t, 2))
	f := newTargets(t, true)
	if err := f.res.Insert("shop.orders", bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: "open"}}, bson.D{{Key: "_id", Value: 2}, {Key: "s", Value: "open"}},
		bson.D{{Key: "_id", Value: 3}, {Key: "s", Value: "done"}}); err != nil {
		t.Fatal(err)
	}
	var launched *Verdict
	k := testWalk(f.targets, s, &o, func(namespace.Namespace) policy.Rule { return enforced }, launchingDecider(&launched))
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	w := update(t, bson.D{{Key: "s", Value: "open"}})
	w.Index = 0
	if d := k.Run(t.Context(), req, &policy.Policy{}, []policy.Write{w}, time.Now()); d.Action != proxy.Forward || launched == nil {
		t.Fatalf("a resolved write whose documents its session holds: action %v", d.Action)
	}
	if len(launched.Pins) != 1 || launched.Pins[0].List != "updates" || launched.Pins[0].Index != 0 || len(launched.Pins[0].IDs) != 2 {
		t.Fatalf("the allowed resolved write's pins: %+v; want its statement pinned to _id 1 and 2", launched.Pins)
	}
}
