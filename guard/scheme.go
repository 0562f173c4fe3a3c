package guard

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Enforcement's side of the locking schemes (package scheme): the unit
// built from the guard's parts, and its verdicts decided and recorded as
// any of enforcement's.

// The schemes' refusal reasons, among the metric's.
const (
	reasonSchemeNotFollowed = scheme.ReasonNotFollowed
	reasonSchemeNotHolder   = scheme.ReasonNotHolder
)

// newSchemes builds the schemes from the guard's parts.
func (g *Guard) newSchemes() *scheme.Schemes {
	cfg := scheme.Config{Store: g.opts.Store, SessionKey: g.owners.Session, Bind: g.owners.Bind, Owner: g.owner,
		Decide: func(req *proxy.Request, pol *policy.Policy, v *scheme.Verdict, start time.Time) proxy.Decision {
			return g.decide(req, pol, verdictOf(v), start)
		},
		Record: func(req *proxy.Request, pol *policy.Policy, v *scheme.Verdict, x *scheme.Violation, took time.Duration) {
			var enforced *enforce.Violation
			if x != nil {
				y := violationOf(x)
				enforced = &y
			}
			g.record(req, pol, verdictOf(v), enforced, took)
		},
		CommitStep: func(req *proxy.Request, pol *policy.Policy, v *scheme.Verdict, r policy.Rule, w policy.Write) *scheme.Violation {
			gv := verdictOf(v)
			x := g.commitSchemeStep(req, pol, gv, r, w)
			v.AuditDone = gv.AuditDone
			if x == nil {
				return nil
			}
			return &scheme.Violation{Rule: x.Rule, Write: x.Write, Reason: x.Reason, IDs: x.IDs, Holder: x.Holder,
				Detail: x.Detail, Advice: x.Advice, Code: x.Code}
		},
		Confirmed: g.confirmedStatus, ExactStrings: g.exactStrings, MayRead: g.mayRead, Log: g.log}
	if rd, ok := g.opts.Resolver.(scheme.Reader); ok {
		cfg.Reader = rd
	}
	if g.opts.Resolver != nil {
		cfg.Resolve = func(ctx context.Context, r policy.Rule, w policy.Write, limit int) ([]docid.ID, time.Duration, error) {
			return g.resolve(ctx, g.resolveSlots, r, w, limit)
		}
	}
	return scheme.New(cfg)
}

// verdictOf is the schemes' verdict as enforcement's: the fields a
// scheme decision sets, the rest zero as for any verdict made for it.
func verdictOf(v *scheme.Verdict) *verdict {
	gv := &verdict{Verdict: enforce.Verdict{Req: v.Req, Writes: v.Writes, Checked: v.Checked, AuditDone: v.AuditDone, LockState: v.LockState}}
	for i, id := range v.Named {
		gv.NameOne(v.NamedIn[i], id)
	}
	if len(v.Violations) > 0 {
		gv.Violations = make([]enforce.Violation, len(v.Violations))
		for i := range v.Violations {
			gv.Violations[i] = violationOf(&v.Violations[i])
		}
	}
	return gv
}

func violationOf(x *scheme.Violation) enforce.Violation {
	return enforce.Violation{Rule: x.Rule, Write: x.Write, Reason: x.Reason, IDs: x.IDs, Holder: x.Holder,
		Detail: x.Detail, Advice: x.Advice, Code: x.Code}
}
