package namespace

import "testing"

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
