package enforce

import (
	"slices"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Verdict is what enforcement found for one message: the writes it
// decided, the violations that stop them, the locks it verified and the
// ids the request named. The audit line, the fence, the launch, the
// implicit locks and the transaction check read it after the decision.
// It belongs to one request at a time: the guard keeps one spare per
// connection and hands it to the connection's next write.
type Verdict struct {
	Writes []policy.Write
	// Rules are the writes' rules for the client, when enforcement looked
	// them up (else nil); shared with the connection's memo (Rules.Ref)
	// or the verdict's own, never written to.
	Rules      []policy.Rule
	Violations []Violation
	Pins       []policy.Pin
	Checked    inflight.Locks // the ids whose locks were verified
	// Req is the request decided, for asking the upstream on its
	// connection.
	Req *proxy.Request
	// LSID is the request's session id once enforcement has read it.
	LSID []byte
	// Named are the ids the request itself names (filters that pin _id,
	// upserted and inserted ids): the only ids a refusal may show. Ids
	// found by resolving a filter stay secret, or a refusal would tell
	// the client which documents match any filter it likes.
	// Each is named in one namespace (namedIn): an id a bulkWrite names
	// in one namespace is not named in another, where the same value may
	// be a document only its filter found.
	Named []docid.ID
	// namedIn says where each of Named was named: Named[previous
	// end:end] in ns. One span for the usual write, in namedInBuf.
	namedIn    []namedSpan
	namedInBuf [1]namedSpan
	// namedKeys indexes Named[:namedIndexed] (IsNamed).
	namedKeys    map[docid.Key]struct{}
	namedIndexed int
	// InTxn: the write is a statement of a transaction (autocommit:
	// false), whose commit is checked as well.
	InTxn bool
	// ResolveSpent is the time its enforced resolutions ran, charged to
	// the caller if it is refused.
	ResolveSpent time.Duration
	// AuditDone: the write's allow record is durable already (a scheme
	// step's, committed before lockgate ran it).
	AuditDone bool
	// LockState: the scheme lock's state an allowed scheme write was
	// decided from (scheme.Verdict.LockState), for the line and trail.
	LockState string
	// Now is the time enforcement started, or the last resolution
	// ended: never later than any lock check's answer. Zero: read the
	// clock again.
	Now time.Time
	// Flights is the write's session's entry in the flight tracker, as
	// the connection kept it, for its flight's launch.
	Flights *inflight.Session
	// Decision is the room an allowed write's decision is made in
	// (Decider.Launch); the decision returned is a copy.
	Decision proxy.Decision
	// Room for the usual write of one statement in one namespace, so
	// that the verdict of a single write is one allocation, not four.
	TokenBuf   [1]int64
	CheckedBuf [1]inflight.NSIDs
	PinBuf     [1]bsoncore.Value // a statement's pin, read by Targets.Of
	NeedBuf    [1]Need
}

// Check records ids as verified in ns, for the audit line.
func (v *Verdict) Check(ns namespace.Namespace, ids []docid.ID) { v.Checked.Add(ns, ids) }

type namedSpan struct {
	ns  namespace.Namespace
	end int
}

// Name records ids as named by the request itself in ns. The first ids
// are kept as they are, not copied, until more are added.
func (v *Verdict) Name(ns namespace.Namespace, ids []docid.ID) {
	if len(ids) == 0 {
		return
	}
	if v.Named == nil {
		v.Named = slices.Clip(ids)
	} else {
		v.Named = append(v.Named, ids...)
	}
	v.spanTo(ns)
}

// NameOne records id as named by the request itself in ns.
func (v *Verdict) NameOne(ns namespace.Namespace, id docid.ID) {
	v.Named = append(v.Named, id)
	v.spanTo(ns)
}

// spanTo makes the last span, in ns, end at the end of Named.
func (v *Verdict) spanTo(ns namespace.Namespace) {
	if n := len(v.namedIn); n > 0 && v.namedIn[n-1].ns.String() == ns.String() {
		v.namedIn[n-1].end = len(v.Named)
		return
	}
	if v.namedIn == nil {
		v.namedIn = v.namedInBuf[:0]
	}
	v.namedIn = append(v.namedIn, namedSpan{ns: ns, end: len(v.Named)})
}

// IsNamed reports whether the request itself named id in ns. A refusal
// asks it of every missing id: past a few named ids they are indexed, or
// a write naming n ids would cost n² comparisons to refuse.
func (v *Verdict) IsNamed(ns namespace.Namespace, id docid.ID) bool {
	if len(v.Named) <= 16 {
		start := 0
		for _, sp := range v.namedIn {
			if sp.ns.String() == ns.String() {
				for _, n := range v.Named[start:sp.end] {
					if n.Equal(id) {
						return true
					}
				}
			}
			start = sp.end
		}
		return false
	}
	if v.namedKeys == nil {
		v.namedKeys = make(map[docid.Key]struct{}, len(v.Named))
	}
	start := 0
	for _, sp := range v.namedIn {
		if sp.end > v.namedIndexed {
			for _, n := range v.Named[max(start, v.namedIndexed):sp.end] {
				v.namedKeys[docid.KeyOf(sp.ns, n)] = struct{}{}
			}
		}
		start = sp.end
	}
	v.namedIndexed = len(v.Named)
	_, ok := v.namedKeys[docid.KeyOf(ns, id)]
	return ok
}

// EnforcedViolation reports whether the command is refused already.
func (v *Verdict) EnforcedViolation() bool {
	return len(v.Violations) > 0 && v.enforcedViolation()
}

// enforcedViolation is EnforcedViolation for a verdict with violations,
// apart as blocked is.
//
//go:noinline
func (v *Verdict) enforcedViolation() bool {
	for _, x := range v.Violations {
		if x.Rule.Mode == policy.Enforce {
			return true
		}
	}
	return false
}

// Enforced is the first violation that refuses the command, or nil.
func (v *Verdict) Enforced() *Violation {
	for i := range v.Violations {
		if v.Violations[i].Rule.Mode == policy.Enforce {
			return &v.Violations[i]
		}
	}
	return nil
}

// Add records a violation.
//
// Not inlined: each call site would hold a Violation (its rule and write,
// about 600 bytes) in its caller's frame, which the walk's function then
// zeroes on every write, refused or not.
//
//go:noinline
func (v *Verdict) Add(r policy.Rule, w policy.Write, reason string, ids []docid.ID, detail string) {
	v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: reason, IDs: ids, Detail: detail})
}

// Blocked reports whether ns already has a violation, so that no lock
// store round trip is spent on a command that is refused anyway.
func (v *Verdict) Blocked(ns namespace.Namespace) bool {
	return len(v.Violations) > 0 && v.blocked(ns)
}

// blocked is Blocked for a verdict with violations. Apart and not
// inlined: the usual write has none, and the loop, inlined into the
// walk's two calls, spread its code over more cache lines.
//
//go:noinline
func (v *Verdict) blocked(ns namespace.Namespace) bool {
	for _, x := range v.Violations {
		if x.Write.NS.String() == ns.String() && x.Rule.Mode == policy.Enforce {
			return true
		}
	}
	return false
}

// FirstWrite is the verdict's first write of ns, or a write of ns alone.
func (v *Verdict) FirstWrite(ns namespace.Namespace) policy.Write {
	for _, w := range v.Writes {
		if w.NS.String() == ns.String() {
			return w
		}
	}
	return policy.Write{NS: ns}
}
