package policy

import (
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
)

// TestLookupOfCaseVariantDatabases: a database that differs from a
// protected one only in ASCII case is protected as that one, because an
// upstream on a case-insensitive file system (FerretDB with SQLite on
// macOS or Windows) writes the protected documents under it; the rule
// takes no implicit lock there (one under "SHOP.orders" would not exclude
// a holder of "shop.orders"). Collections, other look-alikes and a
// database a rule names itself are read exactly. Every variant row was
// the default (off) before.
func TestLookupOfCaseVariantDatabases(t *testing.T) {
	p := compile(t, Off,
		config.NamespaceRule{Match: "shop.orders", Mode: Enforce, UnlockedWriters: config.UnlockedRefuseIfLocked},
		config.NamespaceRule{Match: "Crm.*", Mode: Audit},
		config.NamespaceRule{Match: "SHOPPING.carts", Mode: Off},
	)
	for _, tc := range []struct {
		ns, match string
		mode      Mode
	}{
		{"shop.orders", "shop.orders", Enforce},
		{"SHOP.orders", "shop.orders", Enforce},
		{"Shop.orders", "shop.orders", Enforce},
		{"sHoP.system.buckets.orders", "shop.orders", Enforce},
		{"SHOP.*", "shop.orders", Enforce}, // dropDatabase on the variant
		{"crm.leads", "Crm.*", Audit},
		{"CRM.*", "Crm.*", Audit},
		// Exact elsewhere: collections, other characters, a database
		// some rule names as it is spelled.
		{"shop.ORDERS", "default", Off},
		{"shop.other", "default", Off},
		{"SHOP.other", "default", Off},
		{"ｓhop.orders", "default", Off},
		{"shop .orders", "default", Off},
		{"SHOPPING.orders", "default", Off},
		{"shopping.carts", "SHOPPING.carts", Off},
	} {
		r := p.Lookup(namespace.Of(tc.ns))
		if r.Match != tc.match || r.Mode != tc.mode {
			t.Errorf("Lookup(%q) = %s/%s, want %s/%s", tc.ns, r.Match, r.Mode, tc.match, tc.mode)
		}
	}
	if r := p.Lookup(namespace.Of("shop.orders")); !r.Implicit() {
		t.Error("the protected namespace lost its implicit locks")
	}
	if r := p.Lookup(namespace.Of("SHOP.orders")); r.Implicit() {
		t.Error("a case variant of the protected database takes implicit locks under its own name")
	}
	for db, want := range map[string]string{"SHOP": "shop", "crm": "Crm", "shop": "", "Shopping": "SHOPPING", "SHOPPING": "", "other": ""} {
		got, ok := p.CaseVariantOf(db)
		if got != want || ok != (want != "") {
			t.Errorf("CaseVariantOf(%q) = %q, %v; want %q", db, got, ok, want)
		}
	}
}

// TestLookupOfACaseVariantWithClients: the clients a rule narrows to
// keep its mode on a variant, and the others take no implicit lock there.
func TestLookupOfACaseVariantWithClients(t *testing.T) {
	p := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Enforce,
		Clients: &config.Clients{AppNames: []string{"editor"}}, OtherClients: Enforce, OtherClientsUnlockedWriters: config.UnlockedWait})
	r := p.Lookup(namespace.Of("SHOP.orders")).ForClient("intruder", "", nil)
	if r.Mode != Enforce || r.Implicit() {
		t.Errorf("another client on the variant: %s implicit=%v, want enforce without implicit locks", r.Mode, r.Implicit())
	}
	if r := p.Lookup(namespace.Of("shop.orders")).ForClient("intruder", "", nil); !r.Implicit() {
		t.Error("the rule itself lost its other clients' implicit locks")
	}
}

// TestLookupOfACaseVariantLockCollection: a lockCollection scheme's lock
// collection in a case variant of its database is its lock side, as the
// records an upstream that folds the name writes there are the scheme's.
// It was read as the data side before.
func TestLookupOfACaseVariantLockCollection(t *testing.T) {
	p, err := CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "cc.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"cc.w.lock", "CC.w.lock", "Cc.w.lock"} {
		if r := p.Lookup(namespace.Of(ns)); r.Mode != Enforce || !r.Scheme.LockSide {
			t.Errorf("Lookup(%q) = %s lock side %v, want the enforced lock side", ns, r.Mode, r.Scheme.LockSide)
		}
	}
	if r := p.Lookup(namespace.Of("CC.w")); r.Mode != Enforce || r.Scheme.LockSide {
		t.Errorf("Lookup(CC.w) = %s lock side %v, want the enforced data side", r.Mode, r.Scheme.LockSide)
	}
}

// TestLockNamespaceOfACaseVariant: the locks an insert into a case
// variant must not meet are the protected namespace's, where they are
// taken; every other namespace's are its own.
func TestLockNamespaceOfACaseVariant(t *testing.T) {
	p := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Enforce}, config.NamespaceRule{Match: "Crm.*", Mode: Audit})
	for ns, want := range map[string]string{"SHOP.orders": "shop.orders", "Shop.orders": "shop.orders", "crm.leads": "Crm.leads",
		"shop.orders": "shop.orders", "Crm.leads": "Crm.leads", "other.x": "other.x", "SHOP.other": "shop.other"} {
		r := p.Lookup(namespace.Of(ns))
		if got := r.LockNamespace(namespace.Of(ns)).String(); got != want {
			t.Errorf("Lookup(%q).LockNamespace = %q, want %q", ns, got, want)
		}
	}
}
