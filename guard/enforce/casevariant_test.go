package enforce

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// TestInsertIntoACaseVariantOfALockedID: "SHOP" is a case variant of the
// protected database "shop", which an upstream on a case-insensitive file
// system (FerretDB with SQLite on macOS or Windows) opens for it, so an
// insert into SHOP.orders creates the document in shop.orders. Session B
// (2) holds _id 7 of shop.orders to create it (lock, then upsert); a
// writer inserting {_id: 7} into SHOP.orders must be refused as an
// insert into shop.orders would be (docs/SECURITY.md, "Spell a protected
// namespace another way"). No lock can be held under SHOP.orders (lock
// commands there are refused), so a check under the variant's name finds
// none: the insert was allowed before the check read the protected
// namespace's locks. The same for a case variant of a locked string
// under a collation that ignores case, and an upsert (which needs a lock
// no session can take in the variant).
func TestInsertIntoACaseVariantOfALockedID(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff,
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	rules := func(ns namespace.Namespace) policy.Rule { return pol.Lookup(ns) }
	res := newCollatingResolver()
	res.SetCaseInsensitive("shop.orders")
	for _, c := range []struct {
		name, db string
		others   []any // the _ids of shop.orders another session holds
		body     bson.D
		refused  string // "" allowed
	}{
		{"insert of 7 into SHOP.orders while another holds 7 in shop.orders", "SHOP", []any{7}, insertOf(7), ReasonInsertLocked},
		{"insert of 7 into Shop.orders while another holds 7 in shop.orders", "Shop", []any{7}, insertOf(7), ReasonInsertLocked},
		{"insert of \"C\" into SHOP.orders while another holds \"c\" in shop.orders, which ignores case", "SHOP", []any{"c"}, insertOf("C"), ReasonInsertLocked},
		{"upsert of 7 into SHOP.orders", "SHOP", nil, upsertOf(7), ReasonNotLocked},
		{"insert of 8 into SHOP.orders while another holds 7 in shop.orders", "SHOP", []any{7}, insertOf(8), ""},
		{"insert of 7 into shop.orders while another holds 7 (the protected spelling)", "shop", []any{7}, insertOf(7), ReasonInsertLocked},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := memstore.New(memstore.Config{})
			for _, v := range c.others {
				acquire(t, s, ownerOf(2), "shop.orders", id(t, v))
			}
			d, x := walkOf(s, res, ownerOf(1), rules, c.db)(t, c.body)
			switch {
			case c.refused == "" && d.Action != proxy.Forward:
				t.Fatalf("refused (%+v), want allowed", x)
			case c.refused != "" && (d.Action != proxy.Reply || x == nil || x.Reason != c.refused):
				t.Fatalf("action %v, violation %+v; want refused %s", d.Action, x, c.refused)
			}
		})
	}
}
