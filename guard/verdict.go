package guard

import (
	"slices"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/policy"
)

// The verdict: enforcement's (enforce.Verdict), which the audit line, the
// fence, the launch, the implicit locks and the transaction check read
// after it, with the plans of the units that act on an allowed write.

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

// verdict is enforcement's verdict (enforce.Verdict) with the plans of
// the units that act on an allowed write: the fence, the flight and the
// implicit locks.
type verdict struct {
	enforce.Verdict
	// fence: the statements of fenced namespaces and their tokens.
	fence *fencePlan
	// flight: the locks an allowed enforced write holds while in flight.
	flight *flightPlan
	// implicit: the writes of a session that holds none of their locks,
	// under rules that take implicit locks for them (implicit.go).
	implicit *implicitPlan
	// home is the connection the verdict came from (newVerdict), which
	// its flight may give it back to.
	home *connState
	// Room for the usual write's flight and lock needs (see
	// enforce.Verdict's buffers).
	flightBuf flightPlan
	needBuf   [1]nsNeed
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
