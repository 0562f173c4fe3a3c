package enforce

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Refusal reasons of enforcement, in the detail document, the decision log
// and the metrics.
const (
	ReasonNotLocked          = "not_locked"
	ReasonHeldByOther        = "held_by_other"
	ReasonInsertLocked       = refuse.ReasonInsertLocked
	ReasonCollectionWrite    = refuse.ReasonCollectionWrite
	ReasonUnclassifiable     = refuse.ReasonUnclassifiable
	ReasonTooManyCandidates  = refuse.ReasonTooManyCandidates
	ReasonResolveFailed      = "resolve_failed"
	ReasonUnverifiableUpsert = "unverifiable_upsert"
	// ReasonUnverified: audit only; not resolved, so not known either way.
	ReasonUnverified = "unverified"
	// ReasonCappedInsert: an insert into a capped collection may evict.
	ReasonCappedInsert = "capped_insert"
)

// Decisions, as the decision log and the metrics name them.
const (
	DecisionAllow       = "allow"
	DecisionReject      = "reject"
	DecisionWouldReject = "would_reject" // audit mode
)

// Violation is one reason a write may not proceed: refused where its
// rule enforces, logged where it audits.
type Violation struct {
	Rule   policy.Rule
	Write  policy.Write
	Reason string
	IDs    []docid.ID
	Holder *lockstore.Holder
	Detail string // what a person should know, without the advice
	// Advice, when set, replaces the reason's usual advice: a detail
	// that already says what to do needs no other.
	Advice string
	// Code, when set, replaces LockBusy (an implicit lock's wait that ran
	// out is a LockTimeout, as acquireLock's is).
	Code mongoerr.Code
}

// CommandName is the request's command as a refusal names it: the
// command, or the legacy opcode.
func CommandName(req *proxy.Request) string {
	if req.Command != nil {
		return req.Command.Name
	}
	return req.Message.Header().OpCode.String()
}

// Refusal renders an enforced violation as the command's error: LockBusy
// unless the violation names its code, and a message that says what was
// refused, why, and what to do.
func Refusal(req *proxy.Request, x Violation) *refuse.Error {
	advice := "nothing was written: acquire the lock with acquireLock in the same session, then retry"
	switch x.Reason {
	case refuse.ReasonNoSession:
		advice = "run the write in an explicit session (startSession) that holds the lock"
	case refuse.ReasonUnauthenticated:
		advice = "nothing was written: authenticate, acquire the lock with acquireLock, then retry in the same session"
	case ReasonHeldByOther:
		advice = "wait for the holder to release it (acquireLock with waitMS), then retry in the session that holds it"
		if x.Holder != nil && refuse.OwnApplication(req.Client, *x.Holder) {
			advice = refuse.OwnAppAdvice
		}
	case ReasonCollectionWrite:
		advice = "ask an operator to allow collection writes for this namespace (allowCollectionWrites)"
	case ReasonCappedInsert:
		advice = "ask an operator to allow capped inserts for this namespace (allowCappedInserts) if evictions are acceptable; nothing was written"
	case ReasonTooManyCandidates, ReasonUnverifiableUpsert:
		advice = "lock the documents and name their _id values in the filter"
	case refuse.ReasonUnavailable, ReasonResolveFailed:
		advice = "retry when the lock store and the database are reachable; nothing was written"
	case ReasonUnclassifiable, ReasonInsertLocked, scheme.ReasonNotFollowed, scheme.ReasonNotHolder:
		advice = "nothing was written"
	}
	if x.Advice != "" {
		advice = x.Advice
	}
	return &refuse.Error{
		Code:   cmp.Or(x.Code, mongoerr.LockBusy),
		Reason: x.Reason,
		NS:     x.Write.NS.String(),
		IDs:    x.IDs,
		Holder: x.Holder,
		Msg:    fmt.Sprintf("lockgate: %s on %s refused: %s; %s", CommandName(req), x.Write.NS, x.Detail, advice),
	}
}

// Undisclosed is x as a caller who may not read its namespace sees it:
// without the holder, in the detail document and in the message. "Held
// by another" itself answers whether the id is locked, so it becomes
// "not locked".
func Undisclosed(x Violation) Violation {
	if x.Holder == nil {
		return x
	}
	who := refuse.DescribeHolder(*x.Holder)
	x.Holder = nil
	if x.Reason == ReasonHeldByOther {
		x.Reason = ReasonNotLocked
		x.Detail = fmt.Sprintf("this session does not hold the lock on %s", refuse.IDsString(x.IDs))
		return x
	}
	x.Detail = strings.ReplaceAll(x.Detail, " ("+who+")", "")
	x.Detail = strings.ReplaceAll(x.Detail, who, refuse.HeldByAnother)
	return x
}

// Decider turns a verdict into the proxy's action: a refusal of its
// first enforced violation, or the allowed write's launch. V is the
// verdict as the caller keeps it (enforce's Verdict with the plans of
// what acts on an allowed write), handed back to its funcs untouched.
// Its funcs are set once and the Decider shared.
type Decider[V any] struct {
	// Record logs and counts the decision at now, and makes its audit
	// record durable where the rule requires one; a violation back: it
	// could not, and the write, unless refused already, is refused by it.
	Record func(req *proxy.Request, pol *policy.Policy, v V, enforced *Violation, took time.Duration, now time.Time) *Violation
	// Shown is a refusal as req's caller may see it (Undisclosed, unless
	// it may read the namespace); nil: as it is.
	Shown func(req *proxy.Request, x Violation) Violation
	// Launch makes an allowed write's decision (its edit and its flight)
	// out of d, a forward, now being the decision's end: no later than
	// the write leaves. d is the verdict's own room (Verdict.Decision):
	// a decision returned by value (about 20 words) was copied at every
	// call between the launch and the walk.
	Launch func(req *proxy.Request, pol *policy.Policy, v V, now time.Time, d *proxy.Decision)
}

// Decide decides v, whose enforcement verdict is base, started at start.
func (d *Decider[V]) Decide(req *proxy.Request, pol *policy.Policy, v V, base *Verdict, start time.Time) proxy.Decision {
	return *d.decide(req, pol, v, base, start)
}

// decide is Decide, the decision made in base's room (Verdict.Decision),
// for the walk to copy once.
func (d *Decider[V]) decide(req *proxy.Request, pol *policy.Policy, v V, base *Verdict, start time.Time) *proxy.Decision {
	enforced := base.Enforced()
	// The clock is read on its monotonic side alone (one read, not two):
	// the decision's end is its start plus what it took.
	took := time.Since(start)
	now := start.Add(took)
	if x := d.Record(req, pol, v, enforced, took, now); x != nil && enforced == nil {
		enforced = x // its audit record could not be made durable
	}
	dec := &base.Decision
	if enforced != nil {
		*dec = d.refused(req, enforced)
		return dec
	}
	// The record's sink can block (a full pipe, a required audit record
	// waited for), yet the clock is not read again: what is left of the
	// lease is measured by the proxy just before the write leaves, which
	// sets its maxTimeMS then (proxy.Decision.Leave).
	*dec = proxy.Decision{Action: proxy.Forward}
	d.Launch(req, pol, v, now, dec)
	return dec
}

// refused is the refusal of x as req's caller may see it. Apart from
// Decide, whose frame would otherwise hold the violation's copies on
// every write.
//
//go:noinline
func (d *Decider[V]) refused(req *proxy.Request, x *Violation) proxy.Decision {
	shown := *x
	if d.Shown != nil {
		shown = d.Shown(req, shown)
	}
	return proxy.Decision{Action: proxy.Reply, Reply: Refusal(req, shown).Document()}
}
