package enforce

import (
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

func compile(t *testing.T, p config.Policy) *policy.Policy {
	t.Helper()
	pol, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TestRuleChoice: the rule of a write is its namespace's as it applies to
// the client (a rule narrowed to some networks is the other clients'
// mode elsewhere), and the connection's memo gives the same copy back
// only for the same policy, namespace and client.
func TestRuleChoice(t *testing.T) {
	enforced := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	narrowed := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{Networks: []string{"10.0.0.0/8"}}, OtherClients: config.ModeOff}}})
	inside := &proxy.ClientInfo{ID: 1, Addr: "10.1.2.3:5000"}
	outside := &proxy.ClientInfo{ID: 2, Addr: "127.0.0.1:5000"}

	for _, s := range []struct {
		pol  *policy.Policy
		c    *proxy.ClientInfo
		ns   string
		want policy.Mode
	}{
		{enforced, outside, "db.locked", policy.Enforce},
		{enforced, outside, "db.free", policy.Off},
		{narrowed, inside, "db.locked", policy.Enforce},
		{narrowed, outside, "db.locked", policy.Off},
	} {
		if got := ForClient(s.pol.Lookup(namespace.Of(s.ns)), s.c).Mode; got != s.want {
			t.Errorf("%s from %s: mode %s, want %s", s.ns, s.c.Addr, got, s.want)
		}
		var m Rules
		first := m.Ref(s.pol, s.c, namespace.Of(s.ns))
		if got := first[0].Mode; got != s.want {
			t.Errorf("%s from %s through the memo: mode %s, want %s", s.ns, s.c.Addr, got, s.want)
		}
		if again := m.Ref(s.pol, s.c, namespace.Of(s.ns)); &again[0] != &first[0] {
			t.Errorf("%s from %s: the memo made the rule again", s.ns, s.c.Addr)
		}
	}

	// One connection's memo: a reload, another namespace or another
	// address is another rule, never the one remembered.
	var m Rules
	c := &proxy.ClientInfo{ID: 3, Addr: "10.1.2.3:5000"}
	if got := m.Ref(narrowed, c, namespace.Of("db.locked"))[0].Mode; got != policy.Enforce {
		t.Fatalf("inside: %s", got)
	}
	c.Addr = "127.0.0.1:5000"
	if got := m.Ref(narrowed, c, namespace.Of("db.locked"))[0].Mode; got != policy.Off {
		t.Fatalf("the memo kept the rule of the client's former address: %s", got)
	}
	if got := m.Ref(enforced, c, namespace.Of("db.locked"))[0].Mode; got != policy.Enforce {
		t.Fatalf("the memo kept the rule of the former policy: %s", got)
	}
	if got := m.Ref(enforced, c, namespace.Of("db.free"))[0].Mode; got != policy.Off {
		t.Fatalf("the memo kept the rule of another namespace: %s", got)
	}
}

// TestEqString: eqString is ==, whether or not the strings share their
// bytes: equal at another address, other bytes of the same length, a
// prefix of the same bytes.
func TestEqString(t *testing.T) {
	s := "10.1.2.3:5000"
	for _, c := range []struct {
		a, b string
	}{
		{s, s},
		{s, string([]byte(s))},
		{s, "10.1.2.4:5000"},
		{s, s[:len(s)-1]},
		{"", ""},
		{s, ""},
	} {
		if got := eqString(c.a, c.b); got != (c.a == c.b) {
			t.Errorf("eqString(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// TestRulesMemoSeesTheIdentity: a connection's rule memo gives a rule
// narrowed to some users or applications back only to the same user and
// application: a connection that authenticates as another user (or
// logs out), or names its application only after writing, gets its own
// rule. Mutants: Rules.Ref ignoring the user, or the application (the
// memo kept the rule of the identity the connection had before).
func TestRulesMemoSeesTheIdentity(t *testing.T) {
	byUser := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{Users: []string{"batch@admin"}}, OtherClients: config.ModeOff}}})
	byApp := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{AppNames: []string{"billing"}}, OtherClients: config.ModeOff}}})
	ns := namespace.Of("db.locked")
	for _, s := range []struct {
		what          string
		pol           *policy.Policy
		app, user     string
		app2, user2   string
		before, after policy.Mode
	}{
		{"authenticates as the narrowed user", byUser, "", "web@admin", "", "batch@admin", policy.Off, policy.Enforce},
		{"logs out", byUser, "", "batch@admin", "", "", policy.Enforce, policy.Off},
		{"names its application late", byApp, "", "", "billing", "", policy.Off, policy.Enforce},
	} {
		c := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
		var m Rules
		guardtest.SetIdentity(t, c, s.app, s.user)
		if got := m.Ref(s.pol, c, ns)[0].Mode; got != s.before {
			t.Fatalf("%s: before, mode %s, want %s", s.what, got, s.before)
		}
		guardtest.SetIdentity(t, c, s.app2, s.user2)
		if got := m.Ref(s.pol, c, ns)[0].Mode; got != s.after {
			t.Errorf("%s: the memo gave mode %s, want %s", s.what, got, s.after)
		}
	}
}
