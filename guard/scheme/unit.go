// Package scheme enforces the locking schemes of applications that lock
// documents themselves (docs/SCHEMES.md): holderFields, lockDocument,
// lockCollection and flag. Each scheme lock is mirrored by a lock in the
// lock store (the mirror), taken and dropped as the database shows the
// scheme's own lock taken and released; a write is decided from the
// mirror, and an acquire or release is run by the proxy itself on the
// client's connection, so that the mirror follows what the database did.
//
// The unit is called by enforcement for a command that writes to a
// namespace under a scheme (Schemes.Enforce). It fills its own Verdict
// and hands it to enforcement (Config.Decide, Config.Record), which owns
// the decision, its log line, metrics and audit record; it knows nothing
// of the guard otherwise, and is built from what Config gives it.
package scheme

import (
	"context"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Refusal reasons under a locking scheme, in the detail document, the
// decision log and the metrics.
const (
	// ReasonNotFollowed: the write is none of the scheme's steps.
	ReasonNotFollowed = "scheme_not_followed"
	// ReasonNotHolder: a holder's write from someone who does not hold
	// the scheme lock.
	ReasonNotHolder = "scheme_not_holder"
)

// Store is what the schemes need of the lock store, where the mirrors
// live (guard.LockStore has it). A store that also tells whether any lock
// may be held in a namespace (MayHoldLocks) spares inserts a read.
type Store interface {
	Acquire(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error)
	Renew(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error)
	Release(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error)
	Status(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	Holds(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error)
}

// Violation is one reason a write under a scheme may not proceed; the
// guard's violation, field for field.
type Violation struct {
	Rule   policy.Rule
	Write  policy.Write
	Reason string
	IDs    []docid.ID
	Holder *lockstore.Holder
	Detail string
	// Advice and Code, when set, replace the reason's usual advice and
	// LockBusy (only an audit trail's refusal sets them: CommitStep).
	Advice string
	Code   mongoerr.Code
}

// Verdict is what the schemes found for one command, which enforcement
// decides and records.
type Verdict struct {
	Req        *proxy.Request
	Writes     []policy.Write
	Violations []Violation
	// Stale are the indexes of the violations of holders whose scheme
	// lock was taken over.
	Stale []int
	// Checked are the ids whose locks were verified, for the audit line.
	Checked inflight.Locks
	// Named are the ids the request itself names: the only ids a refusal
	// may show. NamedIn[i] is the namespace Named[i] was named in.
	Named   []docid.ID
	NamedIn []namespace.Namespace
	// AuditDone: the write's allow record is durable already (CommitStep).
	AuditDone bool
	// LockState is the state of the scheme lock an allowed write was
	// decided from (the State values, comma-separated where a command's
	// writes found several), for the decision line and the audit trail:
	// an operator tells a takeover from a theft by it.
	LockState string
}

// The states a scheme lock was in when a write was allowed (or answered
// busy by lockgate itself).
const (
	// StateHeld: the caller holds the lock (its write, renewal, release).
	StateHeld = "held"
	// StateFree: an acquire of a lock nobody held, of a document or lock
	// record that showed none.
	StateFree = "free"
	// StateTakeover: an acquire of a lock whose previous holder's lock
	// had expired (the document still showing it, or a lock record
	// lockgate removed as abandoned).
	StateTakeover = "takeover"
	// StateExpired: the write of a holder the document still names,
	// whose lock expired and was not taken over.
	StateExpired = "expired"
	// StateAbandoned: the recovery of a lock nobody holds any more (a
	// flag cleared, an abandoned lock record deleted) by anyone.
	StateAbandoned = "abandoned"
	// StateAbsent: a delete of a lock record that is not there.
	StateAbsent = "absent"
	// StateBusy: an acquire of a lock another holder has, answered with
	// the scheme's own "busy" by lockgate.
	StateBusy = "busy"
)

// state records that a write was decided from lock state s.
func (v *Verdict) state(s string) {
	switch {
	case v.LockState == "":
		v.LockState = s
	case v.LockState == s, strings.HasPrefix(v.LockState, s+","), strings.HasSuffix(v.LockState, ","+s), strings.Contains(v.LockState, ","+s+","):
	default:
		v.LockState += "," + s
	}
}

// add records a violation.
func (v *Verdict) add(r policy.Rule, w policy.Write, reason string, ids []docid.ID, detail string) {
	v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: reason, IDs: ids, Detail: detail})
}

// check records ids as verified in ns.
func (v *Verdict) check(ns namespace.Namespace, ids []docid.ID) { v.Checked.Add(ns, ids) }

// enforcedViolation reports whether the command is refused already.
func (v *Verdict) enforcedViolation() bool {
	for _, x := range v.Violations {
		if x.Rule.Mode == policy.Enforce {
			return true
		}
	}
	return false
}

// Config is what the schemes need from outside: the lock store, the
// document reader, the owner keys, and enforcement's decision, record
// and reads.
type Config struct {
	Store Store
	// Reader reads a document's lock fields with the proxy's own client;
	// nil when there is none (every read then fails, closed).
	Reader Reader
	// SessionKey is the owner key of a (user, lsid) session; Bind the
	// keyed owner binding of a value; Owner the lock owner of a request's
	// session under a binding.
	SessionKey func(user string, lsid []byte) []byte
	Bind       func(v string) string
	Owner      func(req *proxy.Request, lsid []byte, bind string) lockstore.Owner
	// Decide decides v as enforcement decides any verdict (a refusal, or
	// the request forwarded) and records it.
	Decide func(req *proxy.Request, pol *policy.Policy, v *Verdict, start time.Time) proxy.Decision
	// Record records v (the decision line, metrics, the audit trail) when
	// the schemes answer themselves; x, when set, is the one violation
	// the answer stands for.
	Record func(req *proxy.Request, pol *policy.Policy, v *Verdict, x *Violation, took time.Duration)
	// CommitStep makes the allow record of a step lockgate runs itself
	// durable first, where the rule requires it (setting v.AuditDone); a
	// violation when it cannot.
	CommitStep func(req *proxy.Request, pol *policy.Policy, v *Verdict, r policy.Rule, w policy.Write) *Violation
	// Confirmed is the lock store's status not trusting a head that lags
	// behind its claims.
	Confirmed func(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	// ExactStrings reports whether string values compare exactly for w
	// (the simple collation).
	ExactStrings func(ctx context.Context, w policy.Write) bool
	// MayRead is why the caller may not read ns ("" when it may).
	MayRead func(ctx context.Context, req *proxy.Request, ns namespace.Namespace) string
	// Resolve finds the documents w's filter matches, up to limit, within
	// enforcement's bounds; nil when there is no resolver.
	Resolve func(ctx context.Context, r policy.Rule, w policy.Write, limit int) ([]docid.ID, time.Duration, error)
	Log     *zap.Logger
}

// Schemes is the unit. It is safe for concurrent use.
type Schemes struct {
	cfg  Config
	keys mirrorKeys
	// Test, when set (tests only), sees scheme steps between their reads
	// and their lock store calls.
	Test *TestHooks
}

// New returns the unit.
func New(cfg Config) *Schemes { return &Schemes{cfg: cfg} }

// TestHooks let tests run another client's step inside a window.
type TestHooks struct {
	// BeforeRead runs when a release from a non-holder, having found the
	// lock free, is about to read its record.
	BeforeRead func(ns namespace.Namespace, id docid.ID)
	// BeforeAdopt runs after a live record was read, before it is adopted.
	BeforeAdopt func(ns namespace.Namespace, id docid.ID)
	// BeforeDelete runs when a release has decided to delete record id
	// (the holder's, or, from a non-holder, an abandoned or absent one
	// under a mirror taken for the delete), before the delete is sent.
	BeforeDelete func(ns namespace.Namespace, id docid.ID)
}

// idCopy is the ID of one value of a request's buffer, with its own copy
// of the bytes.
func idCopy(v bsoncore.Value) (docid.ID, error) {
	ids, err := docid.Copy([]bsoncore.Value{v})
	if err != nil {
		return docid.ID{}, err
	}
	return ids[0], nil
}

// name records id as named by the request itself in ns.
func (v *Verdict) name(ns namespace.Namespace, id docid.ID) {
	v.Named, v.NamedIn = append(v.Named, id), append(v.NamedIn, ns)
}
