package guard

import (
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// planOf is the request's plan: the one walk of its message, made by the
// first stage that reads it (the boundary, when a lock store is sealed or
// introspection is refused; enforcement otherwise) and kept on the request
// for the stages after it. A request no stage plans (nothing sealed,
// nothing audited or enforced) is never walked.
func planOf(req *proxy.Request) *policy.Plan {
	if p, ok := req.Plan.(*policy.Plan); ok {
		return p
	}
	p := policy.NewPlan(req.Message, req.Command)
	req.Plan = p
	return p
}
