package enforce

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
)

// decision is what the fakes around a Decider saw of one decision.
type decision struct {
	recorded   bool
	enforced   *Violation
	violations []Violation
	launched   bool
	// checked are the ids recorded as verified, by namespace.
	checked map[string][]docid.ID
}

// decideWrites runs enforcement's walk, lock check and decision over an
// update of o's with one statement per element of stmts, each pinning
// its ids by _id, as the guard runs them: the rule, the owner, the
// record and the launch are fakes, the last two noting what they were
// given.
func decideWrites(t *testing.T, s Store, o lockstore.Owner, stmts []stmt) (proxy.Decision, decision) {
	t.Helper()
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	rules := map[string]policy.Rule{}
	var writes []policy.Write
	for _, st := range stmts {
		w := update(t, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: st.ids}}}})
		w.NS = namespace.Of(st.ns)
		writes = append(writes, w)
		rules[st.ns] = policy.Rule{Mode: st.mode, MaxCandidates: 10}
	}
	var seen decision
	d := &Decider[*Verdict]{
		Record: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, enforced *Violation, _ time.Duration, _ time.Time) *Violation {
			seen.recorded, seen.enforced, seen.violations = true, enforced, v.Violations
			seen.checked = map[string][]docid.ID{}
			for _, x := range v.Checked {
				seen.checked[x.NS.String()] = x.IDs
			}
			return nil
		},
		Launch: func(*proxy.Request, *policy.Policy, *Verdict, time.Time, *proxy.Decision) {
			seen.launched = true
		},
	}
	k := testWalk(newTargets(t, false).targets, s, &o, func(ns namespace.Namespace) policy.Rule { return rules[ns.String()] }, d)
	return k.Run(context.Background(), req, &policy.Policy{}, writes, time.Now()), seen
}

type stmt struct {
	ns   string
	mode policy.Mode
	ids  bson.A // the _ids its filter pins
}

// TestAllow: enforcement's walk, lock check and decision, on a lock store in
// memory: a pinned write whose session holds the lock is launched and
// its id recorded as checked; one whose session does not is refused
// with LockBusy and never launched; under audit the same write is
// launched with its violation recorded; and a command whose statements
// are all held but one is refused as a whole.
func TestAllow(t *testing.T) {
	s := memstore.New(memstore.Config{})
	a, b := ownerOf(1), ownerOf(2)
	const orders, invoices = "shop.orders", "shop.invoices"
	seven, eight := id(t, 7), id(t, 8)
	acquire(t, s, a, orders, seven)
	acquire(t, s, b, orders, eight)
	acquire(t, s, a, invoices, seven)

	t.Run("held", func(t *testing.T) {
		d, seen := decideWrites(t, s, a, []stmt{{orders, policy.Enforce, bson.A{7}}})
		if d.Action != proxy.Forward || !seen.launched {
			t.Fatalf("a write whose lock its session holds: action %v, launched %v; want forwarded and launched", d.Action, seen.launched)
		}
		if !seen.recorded || seen.enforced != nil || len(seen.violations) != 0 {
			t.Errorf("recorded %v with enforced %+v and violations %+v; want recorded as allowed", seen.recorded, seen.enforced, seen.violations)
		}
		if ids := seen.checked[orders]; len(ids) != 1 || !ids[0].Equal(seven) {
			t.Errorf("recorded as checked %v, want _id 7 in %s", seen.checked, orders)
		}
	})

	t.Run("not held", func(t *testing.T) {
		d, seen := decideWrites(t, s, a, []stmt{{orders, policy.Enforce, bson.A{8}}})
		if d.Action != proxy.Reply || seen.launched {
			t.Fatalf("a write of a document another session locked: action %v, launched %v; want refused, not launched", d.Action, seen.launched)
		}
		if code := refusalCode(t, d); code != mongoerr.LockBusy {
			t.Errorf("code %d, want LockBusy", code)
		}
		if seen.enforced == nil || seen.enforced.Reason != ReasonNotLocked || seen.enforced.Holder != nil {
			t.Errorf("recorded enforced violation %+v, want %s naming no holder (the caller may not be told)", seen.enforced, ReasonNotLocked)
		}
	})

	t.Run("audit", func(t *testing.T) {
		d, seen := decideWrites(t, s, a, []stmt{{orders, policy.Audit, bson.A{8}}})
		if d.Action != proxy.Forward || !seen.launched {
			t.Fatalf("an audited write of a document it does not hold: action %v, launched %v; want forwarded", d.Action, seen.launched)
		}
		if !seen.recorded || seen.enforced != nil || len(seen.violations) != 1 || seen.violations[0].Reason != ReasonNotLocked {
			t.Errorf("recorded %v, enforced %+v, violations %+v; want its violation recorded, nothing enforced", seen.recorded, seen.enforced, seen.violations)
		}
	})

	t.Run("one statement of several", func(t *testing.T) {
		d, seen := decideWrites(t, s, a, []stmt{
			{invoices, policy.Enforce, bson.A{7}},
			{orders, policy.Enforce, bson.A{8}},
			{orders, policy.Enforce, bson.A{7}},
		})
		if d.Action != proxy.Reply || seen.launched {
			t.Fatalf("a command one of whose statements writes another session's document: action %v, launched %v; want refused as a whole", d.Action, seen.launched)
		}
		if seen.enforced == nil || seen.enforced.Write.NS.String() != orders {
			t.Errorf("refused by %+v, want the write of %s", seen.enforced, orders)
		}
	})
}

func refusalCode(t *testing.T, d proxy.Decision) mongoerr.Code {
	t.Helper()
	c, ok := d.Reply.Lookup("code").AsInt64OK()
	if !ok {
		t.Fatalf("reply %v has no code", d.Reply)
	}
	return mongoerr.Code(c)
}
