package enforce

import (
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
)

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
	k := &Walk[*Verdict]{Targets: f.targets, Checker: &Checker[*Verdict]{Locks: NewLocks(s)},
		Rules: func(*policy.Policy, *proxy.Request, namespace.Namespace) []policy.Rule {
			return []policy.Rule{enforced}
		},
		New: func(req *proxy.Request, start time.Time) (*Verdict, *Verdict) {
			v := &Verdict{Req: req, Now: start}
			return v, v
		},
		Owner: func(*proxy.Request, *Verdict) (*lockstore.Owner, bool) { return &o, true },
		Decider: &Decider[*Verdict]{
			Record: func(*proxy.Request, *policy.Policy, *Verdict, *Violation, time.Duration, time.Time) *Violation {
				return nil
			},
			Launch: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, _ time.Time, _ *proxy.Decision) { launched = v },
		}}
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

// TestVerdictHoldsOnlyProtectedWrites: a command that writes where no
// rule applies and where one does keeps, on its verdict, only the
// protected writes and their rules: the audit line, its metrics and the
// trail read them, and a namespace whose rule is off gets no decision of
// its own. Mutant: protectedOnly keeping every write.
func TestVerdictHoldsOnlyProtectedWrites(t *testing.T) {
	s := memstore.New(memstore.Config{})
	o := ownerOf(1)
	acquire(t, s, o, "shop.orders", id(t, 7))
	rules := map[string]policy.Rule{"shop.orders": enforced, "shop.free": {Mode: policy.Off}}
	var launched *Verdict
	k := &Walk[*Verdict]{Targets: newTargets(t, false).targets, Checker: &Checker[*Verdict]{Locks: NewLocks(s)},
		Rules: func(_ *policy.Policy, _ *proxy.Request, ns namespace.Namespace) []policy.Rule {
			return []policy.Rule{rules[ns.String()]}
		},
		New: func(req *proxy.Request, start time.Time) (*Verdict, *Verdict) {
			v := &Verdict{Req: req, Now: start}
			return v, v
		},
		Owner: func(*proxy.Request, *Verdict) (*lockstore.Owner, bool) { return &o, true },
		Decider: &Decider[*Verdict]{
			Record: func(*proxy.Request, *policy.Policy, *Verdict, *Violation, time.Duration, time.Time) *Violation {
				return nil
			},
			Launch: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, _ time.Time, _ *proxy.Decision) { launched = v },
		}}
	free := update7(t)
	free.NS = namespace.Of("shop.free")
	for _, writes := range [][]policy.Write{{free, update7(t)}, {update7(t), free}} {
		launched = nil
		req := request(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "$db", Value: "admin"}})
		if d := k.Run(t.Context(), req, &policy.Policy{}, writes, time.Now()); d.Action != proxy.Forward || launched == nil {
			t.Fatalf("held write beside a write where no rule applies: action %v", d.Action)
		}
		if len(launched.Writes) != 1 || launched.Writes[0].NS.String() != "shop.orders" || len(launched.Rules) != 1 || launched.Rules[0].Mode != policy.Enforce {
			t.Fatalf("the verdict's writes %v and rules %v; want shop.orders's alone", launched.Writes, launched.Rules)
		}
	}
}
