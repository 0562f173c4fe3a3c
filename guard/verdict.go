package guard

import (
	"slices"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// The verdict: what enforcement found for one message, which the audit
// line, the fence, the launch, the implicit locks and the transaction
// check read after it; its violations are package enforce's, kept in the
// verdict's own form.

// Refusal reasons and decisions of enforcement (package enforce), by the
// names the guard's other files use.
const (
	reasonNotLocked          = enforce.ReasonNotLocked
	reasonHeldByOther        = enforce.ReasonHeldByOther
	reasonInsertLocked       = enforce.ReasonInsertLocked
	reasonCollectionWrite    = enforce.ReasonCollectionWrite
	reasonUnclassifiable     = enforce.ReasonUnclassifiable
	reasonTooManyCandidates  = enforce.ReasonTooManyCandidates
	reasonResolveFailed      = enforce.ReasonResolveFailed
	reasonUnverifiableUpsert = enforce.ReasonUnverifiableUpsert
	reasonUnverified         = enforce.ReasonUnverified
	reasonCappedInsert       = enforce.ReasonCappedInsert

	decisionAllow       = enforce.DecisionAllow
	decisionReject      = enforce.DecisionReject
	decisionWouldReject = enforce.DecisionWouldReject
)

// violation is one reason a write may not proceed: enforce.Violation as
// the verdict keeps it (public returns it as that).
type violation struct {
	rule   policy.Rule
	write  policy.Write
	reason string
	ids    []docid.ID
	holder *lockstore.Holder
	detail string // what a person should know, without the advice
	// advice, when set, replaces the reason's usual advice: a detail
	// that already says what to do needs no other.
	advice string
	// code, when set, replaces LockBusy (an implicit lock's wait that ran
	// out is a LockTimeout, as acquireLock's is).
	code mongoerr.Code
}

// verdict collects what enforcement found for one message.
type verdict struct {
	writes []policy.Write
	// rules are the writes' rules for the client, when enforce looked
	// them up (else nil); shared with the connection's memo (ruleRef) or
	// the verdict's own, never written to.
	rules      []policy.Rule
	violations []violation
	pins       []policy.Pin
	checked    inflight.Locks // the ids whose locks were verified
	// req is the request decided, for asking the upstream on its
	// connection.
	req *proxy.Request
	// lsid is the request's session id once enforce has read it.
	lsid []byte
	// named are the ids the request itself names (filters that pin _id,
	// upserted and inserted ids): the only ids a refusal may show. Ids
	// found by resolving a filter stay secret, or a refusal would tell
	// the client which documents match any filter it likes.
	named []docid.ID
	// namedKeys indexes named[:namedIndexed] (isNamed).
	namedKeys    map[string]struct{}
	namedIndexed int
	// fence: the statements of fenced namespaces and their tokens.
	fence *fencePlan
	// flight: the locks an allowed enforced write holds while in flight.
	flight *flightPlan
	// implicit: the writes of a session that holds none of their locks,
	// under rules that take implicit locks for them (implicit.go).
	implicit *implicitPlan
	// inTxn: the write is a statement of a transaction (autocommit:
	// false), whose commit is checked as well (txn.go).
	inTxn bool
	// resolveSpent is the time its enforced resolutions ran, charged to
	// the caller if it is refused (refused.go).
	resolveSpent time.Duration
	// auditDone: the write's allow record is durable already (a scheme
	// step's, committed before lockgate ran it: commitSchemeStep).
	auditDone bool
	// lockState: the scheme lock's state an allowed scheme write was
	// decided from (scheme.Verdict.LockState), for the line and trail.
	lockState string
	// now is the time enforce started, or the last resolution ended:
	// never later than any lock check's answer (flightLocks).
	now time.Time
	// home is the connection the verdict came from (newVerdict), which
	// its flight may give it back to.
	home *connState
	// flights is the write's session's entry in the flight tracker, as
	// the connection kept it (writeOwner), for its flight's launch.
	flights *inflight.Session
	// Room for the usual write of one statement in one namespace, so
	// that the verdict of a single write is one allocation, not four.
	flightBuf  flightPlan
	tokenBuf   [1]int64
	checkedBuf [1]inflight.NSIDs
	needBuf    [1]nsNeed
	pinBuf     [1]bsoncore.Value // a statement's pin, read by targets
}

// check records ids as verified in ns, for the audit line.
func (v *verdict) check(ns string, ids []docid.ID) { v.checked.Add(ns, ids) }

// isNamed reports whether the request itself named id. A refusal asks it
// of every missing id: past a few named ids they are indexed, or a write
// naming n ids would cost n² comparisons to refuse.
func (v *verdict) isNamed(id docid.ID) bool {
	if len(v.named) <= 16 {
		for _, n := range v.named {
			if n.Equal(id) {
				return true
			}
		}
		return false
	}
	if v.namedKeys == nil {
		v.namedKeys = make(map[string]struct{}, len(v.named))
	}
	for _, n := range v.named[v.namedIndexed:] {
		v.namedKeys[n.Key()] = struct{}{}
	}
	v.namedIndexed = len(v.named)
	_, ok := v.namedKeys[id.Key()]
	return ok
}

// needs are the locks a command's writes need, by namespace in the order
// first written: a slice, as a command writes one namespace or very few.
type needs []nsNeed

type nsNeed struct {
	ns string
	// r is the rule of the namespace's last write: a pointer into the
	// verdict's rules, which outlive every need (a rule is too large to
	// copy on every call).
	r   *policy.Rule
	ids []docid.ID
}

func (n *needs) add(ns string, r *policy.Rule, ids ...docid.ID) {
	for i := range *n {
		if (*n)[i].ns == ns {
			(*n)[i].r = r
			(*n)[i].ids = append((*n)[i].ids, ids...)
			return
		}
	}
	*n = append(*n, nsNeed{ns: ns, r: r, ids: slices.Clip(ids)})
}

// enforcedViolation reports whether the command is refused already.
func (v *verdict) enforcedViolation() bool {
	for _, x := range v.violations {
		if x.rule.Mode == policy.Enforce {
			return true
		}
	}
	return false
}

// add records a violation.
func (v *verdict) add(r policy.Rule, w policy.Write, reason string, ids []docid.ID, detail string) {
	v.violations = append(v.violations, violation{rule: r, write: w, reason: reason, ids: ids, detail: detail})
}

// blocked reports whether ns already has a violation, so that no lock
// store round trip is spent on a command that is refused anyway.
func (v *verdict) blocked(ns string) bool {
	for _, x := range v.violations {
		if x.write.NS.String() == ns && x.rule.Mode == policy.Enforce {
			return true
		}
	}
	return false
}

// public is x as package enforce has it.
func (x *violation) public() enforce.Violation {
	return enforce.Violation{Rule: x.rule, Write: x.write, Reason: x.reason, IDs: x.ids, Holder: x.holder,
		Detail: x.detail, Advice: x.advice, Code: x.code}
}

// violationOfPublic is the verdict's copy of x.
func violationOfPublic(x enforce.Violation) violation {
	return violation{rule: x.Rule, write: x.Write, reason: x.Reason, ids: x.IDs, holder: x.Holder,
		detail: x.Detail, advice: x.Advice, code: x.Code}
}

func firstWrite(ws []policy.Write, ns string) policy.Write {
	for _, w := range ws {
		if w.NS.String() == ns {
			return w
		}
	}
	return policy.Write{NS: namespace.Of(ns)}
}
