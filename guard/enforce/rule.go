package enforce

import (
	"net"
	"unsafe"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// ForClient is rule r as it applies to client c (a rule may be narrowed
// to some clients, config.Clients).
func ForClient(r policy.Rule, c *proxy.ClientInfo) policy.Rule {
	if r.Clients == nil {
		return r
	}
	var ip net.IP
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		ip = a.IP
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		ip = net.ParseIP(h)
	}
	return r.ForClient(c.AppName(), c.User(), ip)
}

// Rules is a connection's memo of the rules it wrote under lately, as
// they apply to its client. The zero value is ready; it is the
// connection's own (not safe for concurrent use).
type Rules struct {
	memo [4]ruleMemo
	next int
}

// Ref is ForClient(pol.Lookup(ns), c) as a slice of one rule that nobody
// writes to: the connection's own copy, made once per policy, namespace
// and client identity, so that a write's verdict points at its rule
// instead of copying 328 bytes of it (and, while the collector marks,
// paying a write barrier for each of its pointers) on every write.
// Callers must not modify the rule.
func (m *Rules) Ref(pol *policy.Policy, c *proxy.ClientInfo, ns namespace.Namespace) []policy.Rule {
	var app, user, addr string
	if c != nil {
		app, user, addr = c.AppName(), c.User(), c.Addr
	}
	for i := range m.memo {
		e := &m.memo[i]
		if e.pol == pol && e.rule != nil && e.ns == ns && eqString(e.app, app) && eqString(e.user, user) && eqString(e.addr, addr) {
			return e.rule[:]
		}
	}
	return m.add(pol, c, ns, app, user, addr)
}

// add makes the memo's rule of ns for c, in place of its oldest. Apart
// and not inlined: the usual write finds its rule in the memo, and this
// look-up and copy of a rule kept Ref's code over more cache lines.
//
//go:noinline
func (m *Rules) add(pol *policy.Policy, c *proxy.ClientInfo, ns namespace.Namespace, app, user, addr string) []policy.Rule {
	r := &[1]policy.Rule{ForClient(pol.Lookup(ns), c)}
	m.memo[m.next] = ruleMemo{pol: pol, ns: ns, app: app, user: user, addr: addr, rule: r}
	m.next = (m.next + 1) % len(m.memo)
	return r[:]
}

// eqString is a == b, told without the runtime's memequal when a and b
// are the same bytes in memory: a memo's app, user and address are the
// client's own strings, which the next write reads again at the same
// addresses (each == of equal strings was a call, about 10 instructions).
func eqString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// ruleMemo is a rule a connection wrote under lately: what ForClient
// depends on (the policy, the namespace, the client's application, user
// and address) and the rule, never changed once made. A new policy, a
// re-authentication or another namespace makes a new one; verdicts still
// pointing at the one it replaces keep it alive.
type ruleMemo struct {
	pol             *policy.Policy
	ns              namespace.Namespace
	app, user, addr string
	rule            *[1]policy.Rule
}
