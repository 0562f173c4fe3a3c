package guard

import (
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// ruleRef is the rule of ns for req's client, from the connection's memo
// (enforce.Rules.Ref); callers must not modify it. A write under a rule
// that is not off is decided next: the connection's state stays held for
// its decision (newVerdict, releaseConn). A function, not a method: the
// walk's Rules is this function itself, not a method value's wrapper,
// which moved the arguments one register along on every call.
func ruleRef(pol *policy.Policy, req *proxy.Request, ns namespace.Namespace) []policy.Rule {
	st := connStateOf(req)
	if st == nil {
		return ruleUnheld(pol, req, ns)
	}
	r := st.rules.Ref(pol, req.Client, ns)
	if r[0].Mode != policy.Off {
		st.hold(req)
	} else {
		st.unlock(req)
	}
	return r
}

// ruleUnheld is ruleRef's rule where the connection's state is not to be
// had (no client, or another request of the connection holds it): a copy
// of its own. Apart and not inlined: the profile-guided build inlines
// ruleRef into the walk, and this branch's look-up and copy of a rule,
// which the usual write never takes, spread the walk's code over more
// cache lines.
//
//go:noinline
func ruleUnheld(pol *policy.Policy, req *proxy.Request, ns namespace.Namespace) []policy.Rule {
	return []policy.Rule{enforce.ForClient(pol.Lookup(ns), req.Client)}
}

// ruleFor is rule r as it applies to req's client (enforce.ForClient).
func (g *Guard) ruleFor(r policy.Rule, req *proxy.Request) policy.Rule {
	return enforce.ForClient(r, req.Client)
}

// pinMemos is the memo of the pinned filters of req's writer (the
// session's or the connection's memos: enforce.PinMemos), while req's
// decision holds the connection (ruleRef, for a rule that is not off);
// nil otherwise, so that no other goroutine can be reading it.
func pinMemos(req *proxy.Request) *enforce.PinMemos {
	if req.Client == nil {
		return nil
	}
	if st, _ := req.Client.Local().(*connState); st != nil && st.deciding.Load() == req {
		return &st.memo().pins
	}
	return nil
}
