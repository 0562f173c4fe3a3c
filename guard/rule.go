package guard

import (
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// ruleRef is the rule of ns for req's client, from the connection's memo
// (enforce.Rules.Ref); callers must not modify it.
func (g *Guard) ruleRef(pol *policy.Policy, req *proxy.Request, ns string) []policy.Rule {
	st := connStateOf(req)
	if st == nil {
		return []policy.Rule{enforce.ForClient(pol.Lookup(ns), req.Client)}
	}
	defer st.unlock(req)
	return st.rules.Ref(pol, req.Client, ns)
}

// ruleFor is rule r as it applies to req's client (enforce.ForClient).
func (g *Guard) ruleFor(r policy.Rule, req *proxy.Request) policy.Rule {
	return enforce.ForClient(r, req.Client)
}
