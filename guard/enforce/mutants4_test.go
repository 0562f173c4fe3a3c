package enforce

import (
	"context"
	"errors"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// The collation check's gaps the second round of the mutation campaign
// found (docs/TESTING.md, "Issue 25: the fourteenth box's mutation
// campaign (h23-mut)").

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

// tellingStore is a memstore that tells where no lock may be held
// (LockTeller), as lockstore.Store does: memstore alone answers "may"
// everywhere, which hides a check asked of the wrong namespace.
type tellingStore struct{ *memstore.Store }

func (s tellingStore) MayHoldLocks(ns namespace.Namespace) bool {
	ids, complete, err := s.MayBeHeldIn(context.Background(), ns, 1)
	return err != nil || !complete || len(ids) > 0
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
			s := tellingStore{memstore.New(memstore.Config{})}
			acquire(t, s.Store, ownerOf(2), "shop.orders", id(t, c.other))
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
