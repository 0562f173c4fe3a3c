package enforce

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
)

// TestInsertOfADocumentWithTwoIDs: an inserted document whose _id appears
// twice is refused where inserted _ids must be unlocked: which of its
// values the server would keep cannot be told, and one of them is locked
// by another session. Mutant: Walk.insert's case !certain never taken
// (the insert went through unchecked).
func TestInsertOfADocumentWithTwoIDs(t *testing.T) {
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, 8))
	walk := collatedWalk(s, newCollatingResolver(), ownerOf(1))
	twice := bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 7}, {Key: "_id", Value: 8}, {Key: "n", Value: 1}}}}}
	if d, x := walk(t, twice); d.Action != proxy.Reply || x == nil || x.Reason != ReasonUnclassifiable {
		t.Fatalf("insert of {_id: 7, _id: 8}, 8 locked by another session: action %v, violation %+v; want refused as %s", d.Action, x, ReasonUnclassifiable)
	}
	if d, _ := walk(t, insertOf(7)); d.Action != proxy.Forward {
		t.Fatalf("insert of {_id: 7}, free: action %v", d.Action)
	}
}

// testWalk is the walk of this package's tests: the given targets and
// lock store, the rule of each namespace from rules, o the owner of every
// write, d deciding; a test sets the other parts it needs on the result.
func testWalk(targets *Targets, s Store, o *lockstore.Owner, rules func(namespace.Namespace) policy.Rule, d *Decider[*Verdict]) *Walk[*Verdict] {
	return &Walk[*Verdict]{Targets: targets, Checker: &Checker[*Verdict]{Locks: NewLocks(s)},
		Rules: func(_ *policy.Policy, _ *proxy.Request, ns namespace.Namespace) []policy.Rule {
			return []policy.Rule{rules(ns)}
		},
		New: func(req *proxy.Request, start time.Time) (*Verdict, *Verdict) {
			v := &Verdict{Req: req, Now: start}
			return v, v
		},
		Owner:   func(*proxy.Request, *Verdict) (*lockstore.Owner, bool) { return o, true },
		Decider: d}
}

// launchingDecider records nothing and keeps the verdict it launches in
// *launched.
func launchingDecider(launched **Verdict) *Decider[*Verdict] {
	return &Decider[*Verdict]{
		Record: func(*proxy.Request, *policy.Policy, *Verdict, *Violation, time.Duration, time.Time) *Violation {
			return nil
		},
		Launch: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, _ time.Time, _ *proxy.Decision) { *launched = v },
	}
}

// recordingDecider is a Decider whose record and launch note what they
// were given; record answers recordErr (an audit record that could not be
// made durable).
func recordingDecider(recorded **Violation, launched *bool, recordErr *Violation) *Decider[*Verdict] {
	return &Decider[*Verdict]{
		Record: func(_ *proxy.Request, _ *policy.Policy, _ *Verdict, x *Violation, _ time.Duration, _ time.Time) *Violation {
			*recorded = x
			return recordErr
		},
		Launch: func(*proxy.Request, *policy.Policy, *Verdict, time.Time, *proxy.Decision) { *launched = true },
	}
}

// TestUnclassifiableIsRefusedByItsNamespacesRule: a write that cannot be
// read with certainty is decided by the rule of the namespace the
// classifier names, not by its command's database's. Mutant:
// Walk.Unclassifiable ignoring the ClassifyError's namespace (the
// database's rule, off here, forwarded it).
func TestUnclassifiableIsRefusedByItsNamespacesRule(t *testing.T) {
	pol := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	var recorded *Violation
	launched := false
	k := &Walk[*Verdict]{Decider: recordingDecider(&recorded, &launched, nil)}
	req := request(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "$db", Value: "admin"}})
	b := &Verdict{Req: req}
	d := k.Unclassifiable(req, pol, b, b, &policy.ClassifyError{NS: namespace.Of("shop.orders"), Reason: "an operation of an unknown kind"}, time.Now())
	if d.Action != proxy.Reply || launched || recorded == nil || recorded.Reason != ReasonUnclassifiable || recorded.Write.NS.String() != "shop.orders" {
		t.Fatalf("an unclassifiable write of shop.orders sent on admin: action %v, launched %v, recorded %+v", d.Action, launched, recorded)
	}
}

// TestUnauthenticatedMixedCommand: where the database requires
// authentication, a command of a connection that has not authenticated
// is refused as unauthenticated when any of its writes is enforced, not
// only its first protected one: its later enforced insert must not be
// checked against the locks (refused as insert_locked for a locked _id,
// forwarded for a free one, which tells which is locked). Mutant:
// unauthenticated looking only at the first protected write.
func TestUnauthenticatedMixedCommand(t *testing.T) {
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, 8))
	rules := map[string]policy.Rule{
		"shop.audited": {Mode: policy.Audit, MaxCandidates: 3, Inserts: policy.InsertsRequireUnlocked},
		"shop.orders":  {Mode: policy.Enforce, MaxCandidates: 3, Inserts: policy.InsertsRequireUnlocked},
	}
	insert := func(ns string, v any) policy.Write {
		return policy.Write{NS: namespace.Of(ns), Kind: policy.KindInsert, Doc: raw(t, bson.D{{Key: "_id", Value: v}})}
	}
	var recorded *Violation
	launched := false
	o := ownerOf(1)
	k := testWalk(newTargets(t, true).targets, s, &o, func(ns namespace.Namespace) policy.Rule { return rules[ns.String()] }, recordingDecider(&recorded, &launched, nil))
	k.AuthRequired = func() bool { return true }
	req := request(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "$db", Value: "admin"}})
	if req.Client.User() != "" {
		t.Fatal("the request's client has authenticated: the test proves nothing")
	}
	d := k.Run(context.Background(), req, &policy.Policy{}, []policy.Write{insert("shop.audited", 1), insert("shop.orders", 8)}, time.Now())
	if d.Action != proxy.Reply || launched || recorded == nil || recorded.Reason != refuse.ReasonUnauthenticated {
		t.Fatalf("an unauthenticated command, audited then enforced insert: action %v, launched %v, recorded %+v; want refused as %s", d.Action, launched, recorded, refuse.ReasonUnauthenticated)
	}
}

// TestSchemeWritesAreTheSchemes: a write under a locking scheme is
// decided by the schemes (Walk.Schemes), not by lockgate's own lock
// check. Mutant: the schemes never asked.
func TestSchemeWritesAreTheSchemes(t *testing.T) {
	s := memstore.New(memstore.Config{})
	o := ownerOf(1)
	acquire(t, s, o, "shop.orders", id(t, 7)) // lockgate's own lock: the scheme's verdict must win
	rule := policy.Rule{Mode: policy.Enforce, MaxCandidates: 3, Scheme: policy.Scheme{Type: config.SchemeHolderFields}}
	asked := 0
	var recorded *Violation
	launched := false
	k := testWalk(newTargets(t, false).targets, s, &o, func(namespace.Namespace) policy.Rule { return rule }, recordingDecider(&recorded, &launched, nil))
	k.Schemes = func(context.Context, *proxy.Request, *policy.Policy, []policy.Write, []policy.Rule, time.Time) (proxy.Decision, bool) {
		asked++
		return proxy.Decision{Action: proxy.Reply}, true
	}
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	d := k.Run(context.Background(), req, &policy.Policy{}, []policy.Write{update7(t)}, time.Now())
	if asked != 1 || d.Action != proxy.Reply || launched {
		t.Fatalf("a write under a scheme: schemes asked %d times, action %v, launched %v; want the schemes' refusal", asked, d.Action, launched)
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
	k := testWalk(newTargets(t, false).targets, s, &o, func(ns namespace.Namespace) policy.Rule { return rules[ns.String()] }, launchingDecider(&launched))
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
