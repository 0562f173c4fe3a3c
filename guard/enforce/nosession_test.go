package enforce

import (
	"context"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"go.mongodb.org/mongo-driver/bson"
)

// TestCheckWithoutASessionFailsClosed: the lock check of a write that
// carries no session, which nobody takes implicit locks for (no Defer,
// or a Defer that declines, as the guard's does under a rule without
// unlockedWriters), refuses it. The walk refuses such writes before the
// check (no_session), so this is the check's own floor: before, such a
// check recorded nothing, neither the ids verified nor a violation, and
// the decision allowed the write (TestAllowNamedForms' sessionless
// cases launched it once the walk's refusal was taken out).
func TestCheckWithoutASessionFailsClosed(t *testing.T) {
	s := memstore.New(memstore.Config{})
	r := policy.Rule{Mode: policy.Enforce, MaxCandidates: 10}
	for _, withDefer := range []bool{false, true} {
		ch := &Checker[*Verdict]{Locks: NewLocks(s)}
		if withDefer {
			ch.Defer = func(*Verdict, *policy.Rule, namespace.Namespace, []docid.ID, []docid.ID) bool { return false }
		}
		req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
		v := &Verdict{Req: req}
		ch.Check(context.Background(), v, v, &r, &lockstore.Owner{}, namespace.Of("shop.orders"), []docid.ID{id(t, 1)})
		x := v.Enforced()
		if x == nil {
			t.Fatalf("Defer set %v: a write without a session was neither refused nor left to implicit locks: checked %v, violations %+v", withDefer, v.Checked, v.Violations)
		}
		if x.Reason != refuse.ReasonNoSession {
			t.Fatalf("Defer set %v: refused with %s, want %s", withDefer, x.Reason, refuse.ReasonNoSession)
		}
	}
}
