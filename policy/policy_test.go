package policy

import (
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
)

func compile(t *testing.T, def Mode, rules ...config.NamespaceRule) *Policy {
	t.Helper()
	p, err := Compile(config.Policy{Default: def, MaxCandidates: 10, Namespaces: rules})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLookupMostSpecificWins(t *testing.T) {
	p := compile(t, Off,
		config.NamespaceRule{Match: "shop.*", Mode: Audit},
		config.NamespaceRule{Match: "shop.orders", Mode: Enforce, MaxCandidates: 3},
		config.NamespaceRule{Match: "shop.sessions", Mode: Off},
		config.NamespaceRule{Match: "crm.leads", Mode: Audit, AllowCollectionWrites: true},
	)
	cases := []struct {
		ns, match string
		mode      Mode
	}{
		{"shop.orders", "shop.orders", Enforce},
		{"shop.sessions", "shop.sessions", Off},
		{"shop.items", "shop.*", Audit},
		{"other.x", "default", Off},
		{"crm.leads", "crm.leads", Audit},
		{"crm.other", "default", Off},
		// A database-wide write meets the strictest rule of that database.
		{"shop.*", "shop.orders", Enforce},
		{"crm.*", "crm.leads", Audit},
		// A write that may reach anything meets the strictest rule of all.
		{"*", "shop.orders", Enforce},
		// Time-series buckets are protected as their collection is.
		{"shop.system.buckets.orders", "shop.orders", Enforce},
	}
	for _, tc := range cases {
		r := p.Lookup(namespace.Of(tc.ns))
		if r.Match != tc.match || r.Mode != tc.mode {
			t.Errorf("Lookup(%q) = %s/%s, want %s/%s", tc.ns, r.Match, r.Mode, tc.match, tc.mode)
		}
	}
	if got := p.Lookup(namespace.Of("shop.orders")).MaxCandidates; got != 3 {
		t.Errorf("rule maxCandidates = %d, want 3", got)
	}
	if got := p.Lookup(namespace.Of("shop.items")).MaxCandidates; got != 10 {
		t.Errorf("policy maxCandidates = %d, want 10", got)
	}
	if p.Lookup(namespace.Of("shop.items")).Inserts != InsertsRequireUnlocked {
		t.Errorf("inserts default to requireUnlocked (issue 16: an intruder's insert of a locked _id)")
	}
	if p.AllOff() {
		t.Errorf("AllOff with enforced rules")
	}
}

func TestStrictDefaultCoversUnknownDatabases(t *testing.T) {
	p := compile(t, Enforce, config.NamespaceRule{Match: "logs.*", Mode: Off})
	if r := p.Lookup(namespace.Of("anything.x")); r.Mode != Enforce {
		t.Errorf("default enforce not applied: %v", r)
	}
	if r := p.Lookup(namespace.Of("logs.x")); r.Mode != Off {
		t.Errorf("logs.* off not applied: %v", r)
	}
	// dropDatabase on logs: the fallback is stricter than logs.*, and is
	// kept, so a database-wide write fails closed.
	if r := p.Lookup(namespace.Of("logs.*")); r.Mode != Enforce {
		t.Errorf("logs.* database-wide = %v", r.Mode)
	}
}

func TestAllOffAndVersion(t *testing.T) {
	off := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Off})
	if !off.AllOff() {
		t.Fatal("AllOff false with every rule off")
	}
	a := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Audit})
	b := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Enforce})
	a2 := compile(t, Off, config.NamespaceRule{Match: "shop.orders", Mode: Audit})
	if a.Version() == b.Version() || a.Version() != a2.Version() || len(a.Version()) != 12 {
		t.Fatalf("versions: %s %s %s", a.Version(), b.Version(), a2.Version())
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, c := range []config.Policy{
		{Default: "strict"},
		{Default: Off, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: "x"}}},
		{Default: Off, Namespaces: []config.NamespaceRule{{Match: "shop", Mode: Audit}}},
		{Default: Off, Namespaces: []config.NamespaceRule{{Match: "a.b", Mode: Audit}, {Match: "a.b", Mode: Off}}},
	} {
		if _, err := Compile(c); err == nil {
			t.Errorf("Compile(%+v) accepted", c)
		}
	}
}
