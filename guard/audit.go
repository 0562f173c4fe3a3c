package guard

import (
	"slices"
	"time"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.uber.org/zap"
)

// record writes the audit trail of one decision: a log line for every
// namespace the message writes under an audited or enforced rule, and the
// decision counters, labelled by rule (a bounded set), never by namespace
// or id.
func (g *Guard) record(req *proxy.Request, pol *policy.Policy, v *verdict, enforced *violation, took time.Duration) {
	g.metrics.decisionSeconds.Observe(took.Seconds())
	var seenBuf [4]string
	seen := seenBuf[:0] // namespaces logged; a message writes very few
	logNS := func(w policy.Write, r policy.Rule, x *violation) {
		if slices.Contains(seen, w.NS) {
			return
		}
		seen = append(seen, w.NS)
		decision, reason := decisionAllow, ""
		if x != nil {
			reason = x.reason
			decision = decisionWouldReject
			if enforced != nil {
				decision = decisionReject
			}
		}
		g.metrics.decisions.WithLabelValues(r.Match, decision, metricReason(reason)).Inc()
		// The line's fields (id lists above all) cost more than the
		// decision itself; build them only when the line is written.
		ce := g.audit.Check(zap.InfoLevel, "decision")
		if ce == nil {
			return
		}
		command := req.Message.Header().OpCode.String()
		var session string
		if req.Command != nil {
			command = req.Command.Name
			if v.lsid != nil {
				session = lockstore.SessionPrefix(v.lsid)
			} else if sid, ok := req.Command.SessionID(); ok {
				session = lockstore.SessionPrefix(sid)
			}
		}
		fp := g.auditFields.Get().(*[]zap.Field) // room for every field below
		fields := append((*fp)[:0],
			zap.String("client", req.Client.Addr),
			zap.String("app", req.Client.AppName()),
			zap.String("user", req.Client.User()),
			zap.String("session", session),
			zap.String("ns", w.NS),
			zap.String("command", command),
			zap.String("mode", string(r.Mode)),
			zap.String("decision", decision),
			zap.String("policyVersion", pol.Version()),
			zap.Duration("took", took))
		if ids, ok := v.checked.lookup(w.NS); ok {
			fields = append(fields, zap.String("ids", idList(ids)))
		}
		if x != nil {
			fields = append(fields, zap.String("reason", reason), zap.String("detail", x.detail))
			if len(x.ids) > 0 {
				fields = append(fields, zap.String("ids", idList(x.ids)))
			}
		}
		ce.Write(fields...)
		// Cores encode or copy the fields in Write (zap's do), so the
		// slice is free again.
		clear(fields)
		*fp = fields[:0]
		g.auditFields.Put(fp)
	}
	for i := range v.violations {
		x := &v.violations[i]
		logNS(x.write, x.rule, x)
	}
	for i, w := range v.writes {
		if len(v.rules) == len(v.writes) {
			logNS(w, v.rules[i], nil) // the rule enforce looked up
		} else {
			logNS(w, g.ruleFor(pol.Lookup(w.NS), req), nil)
		}
	}
}

// metricReason keeps the reason label to the known values.
func metricReason(r string) string {
	if r == "" {
		return "none"
	}
	if slices.Contains(metricReasons, r) {
		return r
	}
	return "other"
}

// metricReasons are the refusal reasons lockgate_decisions_total names;
// any other is counted as "other".
var metricReasons = []string{reasonNotLocked, reasonHeldByOther, reasonInsertLocked, reasonCollectionWrite,
	reasonUnclassifiable, reasonTooManyCandidates, reasonResolveFailed,
	reasonUnverifiableUpsert, reasonNoSession, reasonUnavailable,
	reasonSchemeNotFollowed, reasonSchemeNotHolder, "other"}
