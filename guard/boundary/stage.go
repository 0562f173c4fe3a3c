package boundary

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/reqplan"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Stage refuses, first and whatever the policy, a request that reaches
// the lock store in any form (lock commands on it included) or, while
// anything is enforced, lists or ends other clients' sessions. It is a
// proxy.Stage.
type Stage struct {
	reserved Reserved
	policy   func() *policy.Policy
	log      *zap.Logger
	refusals *prometheus.CounterVec
}

// New returns the boundary of the lock store's namespaces reserved (zero
// seals nothing), under the policy in force that policy returns (nil
// before the first: introspection is then allowed). Each refusal is
// logged to log and counted in refusals by what it protects ("lock_store",
// "session_introspection"): lockgate_reserved_refusals_total, which the
// guard's metrics own so that the series exists from start.
func New(reserved Reserved, policy func() *policy.Policy, log *zap.Logger, refusals *prometheus.CounterVec) *Stage {
	return &Stage{reserved: reserved, policy: policy, log: log, refusals: refusals}
}

// Decide implements proxy.Stage.
func (s *Stage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	e, what := s.refusal(req, s.policy())
	if e == nil {
		return proxy.Decision{}, false
	}
	s.refusals.WithLabelValues(what).Inc()
	level := zap.InfoLevel
	if routineProbe(req) {
		// Every mongosh asks for the startup warnings on connect: a
		// line at info for each would read as an alarm to an
		// operator. It is still counted.
		level = zap.DebugLevel
	}
	s.log.Log(level, "refused a request across the proxy's boundary", zap.String("what", what), zap.Uint64("conn", req.Client.ID),
		zap.String("client", req.Client.Addr), zap.String("app", req.Client.AppName()), zap.String("error", e.Msg))
	return proxy.Decision{Action: proxy.Reply, Reply: e.Document()}, true
}

// refusal returns the refusal of a request that crosses one of
// the lines drawn whatever the policy's modes: it names the lock store's
// namespaces, or, while introspection is not allowed, it lists or ends
// other clients' sessions. The request's plan (reqplan.Of) serves both, and
// enforcement after it. what is the metric label.
func (s *Stage) refusal(req *proxy.Request, pol *policy.Policy) (e *refuse.Error, what string) {
	r := s.reserved
	introspect := pol == nil || pol.SessionIntrospection()
	if r.DB == "" && introspect {
		return nil, ""
	}
	var reserved, reveals string
	if cmd := req.Command; cmd != nil {
		if !introspect && revealsSessions(cmd) && !harmlessSessionCommand(req) {
			reveals = cmd.Name
		} else {
			reserved, reveals = s.refs(reqplan.Of(req), cmd.Name, introspect)
		}
	} else {
		reserved, reveals = s.refs(reqplan.Of(req), "", introspect)
	}
	name := "request"
	if req.Command != nil {
		name = req.Command.Name
	} else {
		name = req.Message.Header().OpCode.String()
	}
	switch {
	case reserved != "":
		return &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonReserved, NS: reserved,
			Msg: fmt.Sprintf("lockgate: %s refused: %s is reserved for the lock store, which clients cannot read or write through the proxy; "+
				"operators see locks on the admin listener (/locks)", name, reserved)}, "lock_store"
	case reveals != "":
		return &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonIntrospection,
			Msg: fmt.Sprintf("lockgate: %s refused: it reveals or ends other clients' logical sessions, and while namespaces are enforced a session id "+
				"is enough to act as a lock holder on a deployment without authentication; an operator can allow it with policy.allowSessionIntrospection", reveals)}, "session_introspection"
	}
	return nil, ""
}

// refs reads the request's plan for a namespace of the lock
// store, or, unless introspect, one that holds other sessions' ids or a
// stage that lists them; command is the command's name, "" for a legacy
// opcode. The plan holds every namespace the request names and every one
// it writes, so nothing the enforcement stage would see a write on can
// pass here unseen.
func (s *Stage) refs(p *policy.Plan, command string, introspect bool) (reserved, reveals string) {
	r := s.reserved
	for _, ref := range p.Refs() {
		db, coll := ref.NS.DB(), ref.NS.Collection()
		switch {
		case r.DB != "" && r.touches(db, coll, command):
			switch {
			case ref.NS.IsUnknown():
				// It may reach any namespace (a change stream over the
				// deployment, applyOps by UUID).
				return r.DB + ".*", ""
			case coll == "":
				return db, ""
			}
			return db + "." + coll, ""
		case !introspect && reveals == "" && isSessionsCollection(db, coll):
			reveals = db + "." + coll
		}
	}
	if !introspect && reveals == "" {
		for _, st := range p.Stages() {
			if sessionStages[st] {
				return "", st
			}
		}
	}
	return "", reveals
}
