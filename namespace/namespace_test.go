package namespace

import (
	"strings"
	"testing"
)

func TestSplitAtTheFirstDot(t *testing.T) {
	for _, tc := range []struct {
		in       string
		db, coll string
		split    bool // Split's ok
		parse    bool // Parse's ok
	}{
		{"shop.orders", "shop", "orders", true, true},
		{"shop.system.indexes", "shop", "system.indexes", true, true},
		{"shop.system.buckets.weather", "shop", "system.buckets.weather", true, true},
		{"admin.$cmd", "admin", "$cmd", true, true},
		{"shop.", "shop", "", true, false},
		{".orders", "", "orders", true, false},
		{"shop", "shop", "", false, false},
		{"", "", "", false, false},
	} {
		n, ok := Split(tc.in)
		if n.DB() != tc.db || n.Collection() != tc.coll || ok != tc.split {
			t.Errorf("Split(%q) = %q, %q, %v; want %q, %q, %v", tc.in, n.DB(), n.Collection(), ok, tc.db, tc.coll, tc.split)
		}
		if _, ok := Parse(tc.in); ok != tc.parse {
			t.Errorf("Parse(%q) ok = %v, want %v", tc.in, ok, tc.parse)
		}
		if tc.parse && n.String() != tc.in {
			t.Errorf("Parse(%q).String() = %q", tc.in, n.String())
		}
	}
}

func TestForms(t *testing.T) {
	if n := Database("shop"); !n.IsDatabase() || n.String() != "shop" || n.Valid() {
		t.Errorf("Database: %#v %q", n, n)
	}
	if n := Unknown(); !n.IsUnknown() || n.String() != Any {
		t.Errorf("Unknown: %#v %q", n, n)
	}
	if n := New("admin", "$cmd"); !n.IsCommand() {
		t.Errorf("%q is not a command namespace", n)
	}
	if !(Namespace{}).IsZero() || New("a", "b").IsZero() {
		t.Error("IsZero")
	}
}

// TestEqualityIsByParts: == on two namespaces compares their databases
// and collections, however each was made, since lock keys and plan
// references are compared and hashed as they are.
func TestEqualityIsByParts(t *testing.T) {
	for _, tc := range []struct{ a, b Namespace }{
		{New("shop", "orders"), Of("shop.orders")},
		{Database("shop"), Of("shop.")},
		{Database("shop"), Of("shop")},
		{New("shop", ""), Database("shop")},
		{Unknown(), Of("*.*")},
		{New("shop", "system.buckets.x"), Of("shop.system.buckets.x")},
	} {
		if tc.a != tc.b {
			t.Errorf("%#v != %#v", tc.a, tc.b)
		}
	}
	if New("a.b", "c") == Of("a.b.c") {
		t.Error("a database with a dot read as the first part of a namespace")
	}
	if Database("shop") == New("shop", "orders") || Database("a") == Database("ab") {
		t.Error("different namespaces are ==")
	}
}

func TestStringAllocatesNothing(t *testing.T) {
	n := New("shop", "orders")
	var s, db, coll string
	if a := testing.AllocsPerRun(100, func() { s, db, coll = n.String(), n.DB(), n.Collection() }); a != 0 || s != "shop.orders" || db != "shop" || coll != "orders" {
		t.Errorf("String, DB and Collection allocate %v times", a)
	}
}

func TestValidDatabase(t *testing.T) {
	for db, want := range map[string]bool{
		"shop": true, "a-b_c": true, strings.Repeat("d", 63): true,
		"": false, "sh.op": false, "sh$op": false, "sh op": false, `sh\op`: false,
		"sh/op": false, `sh"op`: false, "sh\x00op": false, strings.Repeat("d", 64): false,
	} {
		if got := ValidDatabase(db); got != want {
			t.Errorf("ValidDatabase(%q) = %v, want %v", db, got, want)
		}
	}
}
