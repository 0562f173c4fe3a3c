// Package reqplan keeps a request's plan (policy.Plan) on the request, so
// that the message is walked at most once whichever stage reads it first.
// It sits below every guard stage, none of which owns the plan: the
// boundary makes it when a lock store is sealed or introspection is
// refused, enforcement reads the same one, and a request no stage needs to
// read is never walked. It is not in policy, which knows nothing of the
// proxy's requests, nor in proxy, which knows nothing of policies.
package reqplan

import (
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// The connection tells the plan it keeps in Scratch to let go of each
// request's message once it is handled.
var _ proxy.Forgetter = (*policy.Plan)(nil)

// Of is the request's plan: the one walk of its message, made by the
// first stage that reads it and kept on the request (proxy.Request.Plan)
// for the stages after it. It is read into the connection's plan
// (proxy.Request.Scratch), whose room the last request on the connection
// is done with, so that planning a request allocates nothing.
func Of(req *proxy.Request) *policy.Plan {
	if p, ok := req.Plan.(*policy.Plan); ok {
		return p
	}
	p, ok := req.Scratch.(*policy.Plan)
	if !ok {
		p = new(policy.Plan)
		req.Scratch = p
	}
	p.Read(req.Message, req.Command)
	req.Plan = p
	return p
}
