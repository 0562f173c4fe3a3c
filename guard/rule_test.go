package guard

import (
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
)

// TestRuleMemoFollowsPolicyAndClient: a connection's rules are its own
// copies, made once (ruleRef), and a write is decided by the rule of the
// policy in force for the client as it is now: a reload and a client the
// rule's clients narrow it away from each get their own.
func TestRuleMemoFollowsPolicyAndClient(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	compile := func(p config.Policy) *policy.Policy {
		t.Helper()
		pol, err := policy.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	enforced := compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	open := compile(config.Policy{Default: config.ModeOff})
	narrowed := compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{Networks: []string{"10.0.0.0/8"}}, OtherClients: config.ModeOff}}})

	steps := []struct {
		pol  *policy.Policy
		addr string
		want bool
	}{
		{enforced, "127.0.0.1:5000", false},
		{open, "127.0.0.1:5000", true},
		{enforced, "127.0.0.1:5000", false},
		{narrowed, "127.0.0.1:5000", true},
		{narrowed, "10.1.2.3:5000", false},
		{narrowed, "127.0.0.1:5000", true},
	}
	for i, s := range steps {
		c.g.SetPolicy(s.pol)
		c.client.Addr = s.addr
		for range 2 { // the second from the memo
			if got := c.write(a, 7); got != s.want {
				t.Fatalf("step %d (%s): write let through %v, want %v", i, s.addr, got, s.want)
			}
		}
	}
}
