package guard

import (
	"net"

	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// ruleFor is rule r as it applies to the request's client (a rule may be
// narrowed to some clients, config.Clients).
func (g *Guard) ruleFor(r policy.Rule, req *proxy.Request) policy.Rule {
	if r.Clients == nil {
		return r
	}
	c := req.Client
	var ip net.IP
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		ip = a.IP
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		ip = net.ParseIP(h)
	}
	return r.ForClient(c.AppName(), c.User(), ip)
}

// ruleRef is ruleFor(pol.Lookup(ns), req) as a slice of one rule that
// nobody writes to: the connection's own copy, made once per policy,
// namespace and client identity, so that a write's verdict points at its
// rule instead of copying 328 bytes of it (and, while the collector
// marks, paying a write barrier for each of its pointers) on every write.
// Callers must not modify the rule.
func (g *Guard) ruleRef(pol *policy.Policy, req *proxy.Request, ns string) []policy.Rule {
	st := connStateOf(req)
	if st == nil {
		return []policy.Rule{g.ruleFor(pol.Lookup(ns), req)}
	}
	defer st.mu.Unlock()
	var app, user, addr string
	if c := req.Client; c != nil {
		app, user, addr = c.AppName(), c.User(), c.Addr
	}
	for i := range st.rules {
		m := &st.rules[i]
		if m.pol == pol && m.rule != nil && m.ns == ns && m.app == app && m.user == user && m.addr == addr {
			return m.rule[:]
		}
	}
	r := &[1]policy.Rule{g.ruleFor(pol.Lookup(ns), req)}
	st.rules[st.nextRule] = ruleMemo{pol: pol, ns: ns, app: app, user: user, addr: addr, rule: r}
	st.nextRule = (st.nextRule + 1) % len(st.rules)
	return r[:]
}

// ruleMemo is a rule a connection wrote under lately, as it applies to
// its client: what ruleFor depends on (the policy, the namespace, the
// client's application, user and address) and the rule, never changed
// once made. A new policy, a re-authentication or another namespace makes
// a new one; verdicts still pointing at the one it replaces keep it alive.
type ruleMemo struct {
	pol                 *policy.Policy
	ns, app, user, addr string
	rule                *[1]policy.Rule
}
