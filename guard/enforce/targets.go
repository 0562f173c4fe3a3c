package enforce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Resolver finds which documents a filter matches, for writes whose filter
// does not pin _id. It queries the deployment with the proxy's own client,
// never over the client's connection.
type Resolver interface {
	// Candidates returns the _id of every document that filter matches in
	// ns under collation and hint, at most limit of them.
	Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error)
	// SimpleCollation reports whether the collection's default collation
	// compares strings byte for byte, so that a string _id pins exactly.
	SimpleCollation(ctx context.Context, ns namespace.Namespace) (bool, error)
	// Capped reports whether ns is a capped collection, whose inserts may
	// evict documents.
	Capped(ctx context.Context, ns namespace.Namespace) (bool, error)
}

// Throttle holds back the callers whose writes without a pinned _id cost
// the database too much: a connection whose last resolution ran out of
// time cools down (and shares one resolver slot with the others that
// did), and a caller whose refused writes used up its budget of resolver
// time is refused at once for a while.
type Throttle interface {
	// Cooling is how long req's connection is still cooling down, or 0.
	Cooling(req *proxy.Request) time.Duration
	// Tarpit holds back a refusal during the cool-down.
	Tarpit(ctx context.Context, req *proxy.Request)
	// RefusedWait is how long req's caller is still out of budget, or 0.
	RefusedWait(req *proxy.Request) time.Duration
	// HoldRefusal holds back a refusal made at once for up to d.
	HoldRefusal(ctx context.Context, d time.Duration)
	// Slots is the semaphore req's resolution waits on.
	Slots(req *proxy.Request) chan struct{}
	// Outcome feeds an enforced write's resolution to the cool-down.
	Outcome(req *proxy.Request, r policy.Rule, err error)
}

// TargetsConfig are what the targets unit is built from.
type TargetsConfig struct {
	// Resolver, nil for none: writes whose filter names no _id are then
	// refused where enforced.
	Resolver Resolver
	// ResolveTimeout bounds one resolution, the wait for a slot included.
	ResolveTimeout time.Duration
	// Authority answers whether a caller may read what is resolved for it.
	Authority *authority.Authority
	Throttle  Throttle
	// PinnedIDs copies the values a filter pins into IDs (the connection
	// may have them already); nil: docid.Copy.
	PinnedIDs func(req *proxy.Request, pinned []bsoncore.Value) ([]docid.ID, error)
	// PinMemos is the memo of req's connection's latest pinned filters,
	// req's alone while it is decided; nil (the func, or its answer):
	// every filter is read anew.
	PinMemos func(req *proxy.Request) *PinMemos
	// Resolves counts resolutions by outcome (ok, error, timeout,
	// skipped); Seconds observes how long they ran.
	Resolves *prometheus.CounterVec
	Seconds  prometheus.Observer
}

// Targets finds the documents whose locks a write needs. Safe for
// concurrent use.
type Targets struct {
	cfg                                 TargetsConfig
	ok, failed, timedOut, skippedSeries prometheus.Counter
}

// NewTargets returns the targets unit of cfg.
func NewTargets(cfg TargetsConfig) *Targets {
	if cfg.PinnedIDs == nil {
		cfg.PinnedIDs = func(_ *proxy.Request, v []bsoncore.Value) ([]docid.ID, error) { return docid.Copy(v) }
	}
	return &Targets{cfg: cfg, ok: cfg.Resolves.WithLabelValues("ok"), failed: cfg.Resolves.WithLabelValues("error"),
		timedOut: cfg.Resolves.WithLabelValues("timeout"), skippedSeries: cfg.Resolves.WithLabelValues("skipped")}
}

// Skipped counts n resolutions not run because the command is refused
// already.
func (t *Targets) Skipped(n int) { t.skippedSeries.Add(float64(n)) }

// Target is what Of found for one write.
type Target struct {
	// OK: IDs are the write's targets. Else the write is Later, stopped
	// by the violation Reason names, or, with neither, skipped: its
	// namespace is refused already.
	OK bool
	// IDs are the ids whose locks the write needs.
	IDs []docid.ID
	// Pinned are the ids its filter pins, which the request itself names
	// (a refusal may show them); Upserted, when HasUpserted, the _id its
	// upsert would insert, named too.
	Pinned      []docid.ID
	Upserted    docid.ID
	HasUpserted bool
	// Pin, when Pins, restricts the forwarded statement to the documents
	// a resolution found, none included (enforced writes only).
	Pin  policy.Pin
	Pins bool
	// Resolved: a resolution ran (the clock must be read again); Spent
	// is how long an enforced one took.
	Resolved bool
	Spent    time.Duration
	// Later: the write must be resolved, and Of was asked not to yet.
	Later bool
	// Reason, Detail and Advice, when Reason is set, are the violation
	// that stops the write (Violation).
	Reason, Detail, Advice string
}

func (t *Target) stop(reason, detail string) { t.Reason, t.Detail = reason, detail }

// Of finds the ids whose locks write w needs under rule r: the ids its
// filter pins (buf has room for its pins), or the documents it matches
// now (then its statement is to be pinned to them), plus the _id an
// upsert would insert. Without resolve, a write whose documents would have
// to be resolved is reported Later instead. refused: the write's
// namespace is refused already, so nothing is resolved for it. What it
// finds is written to x, the caller's, zero: a Target returned by value
// (about 30 words) was copied on every write.
func (t *Targets) Of(ctx context.Context, req *proxy.Request, r *policy.Rule, w *policy.Write, resolve, refused bool, buf []bsoncore.Value, x *Target) {
	var memo *PinMemos
	if t.cfg.PinMemos != nil {
		memo = t.cfg.PinMemos(req)
	}
	memoIDs, hasString, ok := memo.get(w.Filter, r.MaxCandidates)
	if ok && !hasString {
		// The usual write: the memo's pin, of an _id no collation
		// compares.
		x.IDs, x.Pinned = memoIDs, memoIDs
		if w.Upsert && !upsertTarget(w, x) {
			return
		}
		x.OK = true
		return
	}
	t.of(ctx, req, r, w, resolve, refused, buf, x, memo, memoIDs, hasString, ok)
}

// of is Of for any write but one whose filter's pin is in the memo
// without a string: memoIDs, hasString and ok are what the memo knows
// (PinMemos.get). Apart and not inlined: its branches, inlined, spread
// the usual write's few instructions over Of's whole code.
//
//go:noinline
func (t *Targets) of(ctx context.Context, req *proxy.Request, r *policy.Rule, w *policy.Write, resolve, refused bool, buf []bsoncore.Value, x *Target, memo *PinMemos, memoIDs []docid.ID, hasString, ok bool) {
	var pinned []bsoncore.Value
	if !ok {
		// No more pins are read than the rule lets a write touch: a
		// filter naming 50,000 ids costs no more than one naming
		// maxCandidates + 1.
		var over bool
		pinned, hasString, ok, over = policy.PinnedIDsInto(buf, w.Filter, r.MaxCandidates)
		if over {
			x.stop(ReasonTooManyCandidates, fmt.Sprintf("its filter names more than %d _id values (the policy's maxCandidates); write in smaller batches", r.MaxCandidates))
			return
		}
	}
	if ok && hasString {
		ok = t.ExactStrings(ctx, *w)
	}
	if !ok && !resolve && t.cfg.Resolver != nil {
		x.Later = true
		return
	}
	switch {
	case ok && memoIDs != nil:
		x.IDs, x.Pinned = memoIDs, memoIDs
	case ok:
		ids, err := t.cfg.PinnedIDs(req, pinned)
		if err != nil {
			x.stop(ReasonUnclassifiable, fmt.Sprintf("its filter pins a value that cannot be a document's _id (%v)", err))
			return
		}
		memo.put(w.Filter, r.MaxCandidates, ids, hasString)
		x.IDs, x.Pinned = ids, ids
	case t.cfg.Resolver == nil:
		x.stop(ReasonResolveFailed, "the filter does not name _id values and no resolver is configured")
		return
	case r.Mode == policy.Enforce && refused:
		// Refused already: what the filter matches cannot change that.
		t.skippedSeries.Inc()
		return
	case r.Mode == policy.Enforce && t.throttled(ctx, req, x):
		return
	default:
		if !t.resolve(ctx, req, r, w, x) {
			return
		}
	}
	if w.Upsert && !upsertTarget(w, x) {
		return
	}
	x.OK = true
	return
}

// The branches of Of that the usual write (a filter pinning its _ids, no
// upsert) does not take are functions of their own, not inlined: their
// copies of the rule and the write (Resolve and UpsertID take them by
// value) and fmt's arguments made Of's frame 1,704 bytes, a stack every
// write touches and that is cold between a connection's writes.

// throttled refuses, for the throttle, an enforced write whose filter
// must be resolved; false: the throttle lets it be resolved.
//
//go:noinline
func (t *Targets) throttled(ctx context.Context, req *proxy.Request, x *Target) bool {
	if t.cfg.Throttle.Cooling(req) > 0 {
		t.skippedSeries.Inc()
		t.cfg.Throttle.Tarpit(ctx, req)
		x.stop(ReasonResolveFailed, fmt.Sprintf("its filter names no _id, and this connection's last such write was too slow to verify, so such writes are refused for %s more; lock the documents and name their _id values in the filter", lockstore.FormatMS(t.cfg.Throttle.Cooling(req).Round(time.Second))))
		x.Advice = "nothing was written"
		return true
	}
	if t.cfg.Throttle.RefusedWait(req) > 0 {
		wait := t.cfg.Throttle.RefusedWait(req)
		t.skippedSeries.Inc()
		t.cfg.Throttle.HoldRefusal(ctx, wait)
		x.stop(ReasonResolveFailed, fmt.Sprintf("its filter names no _id, and looking up the documents of this %s's writes that were then refused anyway has used up its share of the database's time, so such writes are refused at once for %s more; lock the documents and name their _id values in the filter", callerKind(req), lockstore.FormatMS(max(wait, 100*time.Millisecond).Round(100*time.Millisecond))))
		x.Advice = "nothing was written"
		return true
	}
	return false
}

// resolve resolves the documents a filter that pins no _id can touch
// into x; false: x is stopped.
//
//go:noinline
func (t *Targets) resolve(ctx context.Context, req *proxy.Request, r *policy.Rule, w *policy.Write, x *Target) bool {
	limit := r.MaxCandidates
	if e := t.MayRead(ctx, req, w.NS); e != "" {
		x.stop(ReasonResolveFailed, e)
		return false
	}
	cands, spent, err := t.Resolve(ctx, t.cfg.Throttle.Slots(req), *r, *w, limit+1)
	x.Resolved = true
	if r.Mode == policy.Enforce {
		x.Spent = spent
	}
	t.cfg.Throttle.Outcome(req, *r, err)
	if errors.Is(err, ErrResolveSkipped) {
		// Audit only, and every slot busy: the write goes through
		// either way, so it does not queue behind enforced ones.
		x.stop(ReasonUnverified, "the documents it can touch were not resolved: every resolver slot was busy, and an audited write does not wait for one")
		return false
	}
	if err != nil {
		x.stop(ReasonResolveFailed, fmt.Sprintf("the documents it can touch could not be resolved: %v", err))
		if errors.Is(err, context.DeadlineExceeded) || IsMaxTimeExpired(err) {
			x.Detail = fmt.Sprintf("its filter names no _id and was too slow to verify within %s (limits.resolveTimeoutMS); lock the documents and name their _id values in the filter", lockstore.FormatMS(t.cfg.ResolveTimeout))
			x.Advice = "nothing was written"
		}
		return false
	}
	if len(cands) > limit {
		x.stop(ReasonTooManyCandidates, fmt.Sprintf("its filter matches more than %d documents (the policy's maxCandidates); narrow the filter, for example to a list of _id values", limit))
		return false
	}
	x.IDs = cands
	if r.Mode == policy.Enforce {
		x.Pin, x.Pins = policy.Pin{List: w.List, Index: w.Index, IDs: docid.Cores(cands)}, true
	}
	return true
}

// upsertTarget adds an upsert's inserted _id to x; false: x is stopped.
//
//go:noinline
func upsertTarget(w *policy.Write, x *Target) bool {
	id, found, certain := policy.UpsertID(*w)
	if !certain {
		x.stop(ReasonUnverifiableUpsert, "it is an upsert whose inserted _id cannot be known in advance (a pipeline update that does not pin _id)")
		return false
	}
	if found {
		// A value that cannot be an _id names no lock, and the
		// database refuses to insert it.
		if did, err := IDCopy(id); err == nil {
			x.IDs = append(x.IDs, did)
			x.Upserted, x.HasUpserted = did, true
		}
	}

	return true
}

// PinMemos are a connection's memos of its latest filters that pin one
// _id, with the id they pin: a client writes a few documents over and
// over, and reading the filter again (policy.PinnedIDsInto) and copying
// its id cost more than comparing its bytes. What a filter pins is a
// function of its bytes and the limit alone (the rule's maxCandidates),
// and an ID is never modified, so an entry needs no invalidation: it is
// used only for the same bytes under the same limit. Whether its string
// ids compare exactly (the collation) is not kept: it is asked on every
// write (Targets.ExactStrings). The zero value is empty; it is the
// connection's own (not safe for concurrent use).
type PinMemos struct {
	m    [4]pinMemo
	next int
}

type pinMemo struct {
	filter    []byte // a copy, its room reused for the next filter
	limit     int
	ids       []docid.ID // len 1, capacity 1: an append copies
	hasString bool
}

// maxPinMemoFilter bounds the filters memoized: the usual {_id: v} is a
// few dozen bytes.
const maxPinMemoFilter = 128

// get is what the memo knows of filter under limit: the one id it pins;
// false: read it (nil m knows nothing).
func (m *PinMemos) get(filter []byte, limit int) ([]docid.ID, bool, bool) {
	if m == nil {
		return nil, false, false
	}
	for i := range m.m {
		e := &m.m[i]
		if e.ids != nil && e.limit == limit && string(e.filter) == string(filter) {
			return e.ids, e.hasString, true
		}
	}
	return nil, false, false
}

// put keeps ids, what filter pins under limit, when it is one id.
func (m *PinMemos) put(filter []byte, limit int, ids []docid.ID, hasString bool) {
	if m == nil || len(ids) != 1 || len(filter) > maxPinMemoFilter {
		return
	}
	e := &m.m[m.next]
	m.next = (m.next + 1) % len(m.m)
	e.filter = append(e.filter[:0], filter...)
	e.limit, e.ids, e.hasString = limit, ids[:1:1], hasString
}

// Capped reports why an insert, or an upsert that may insert, into w's
// collection is refused under r: the server evicts a capped collection's
// oldest documents to make room, locked ones included, without naming
// them, so no lock check can cover it. Rules opt in with
// allowCappedInserts. "" when it is not refused.
func (t *Targets) Capped(ctx context.Context, r *policy.Rule, w policy.Write) (reason, detail string) {
	if r.AllowCappedInserts {
		return "", ""
	}
	if t.cfg.Resolver == nil {
		// Cannot be told, so it could evict: fail closed.
		return ReasonResolveFailed, fmt.Sprintf("whether %s is a capped collection cannot be read here, and an insert there could evict locked documents", w.NS)
	}
	capped, err := t.cfg.Resolver.Capped(ctx, w.NS)
	switch {
	case err != nil:
		return ReasonResolveFailed, fmt.Sprintf("whether %s is a capped collection could not be read (%v), and an insert there could evict locked documents", w.NS, err)
	case capped:
		return ReasonCappedInsert, fmt.Sprintf("%s is a capped collection: an insert may evict its oldest documents, locked ones included, which no lock can prevent; the policy does not allow inserts there (allowCappedInserts is false)", w.NS)
	}
	return "", ""
}

// ExactStrings reports whether string _id values compare exactly for w:
// a non-simple collation can make "abc" match "ABC".
func (t *Targets) ExactStrings(ctx context.Context, w policy.Write) bool {
	if w.Collation != nil {
		return CollationSimple(w.Collation)
	}
	if t.cfg.Resolver == nil {
		return false
	}
	simple, err := t.cfg.Resolver.SimpleCollation(ctx, w.NS)
	return err == nil && simple
}

// CollationSimple reports whether an explicit collation document is the
// simple (binary) collation.
func CollationSimple(c bsoncore.Document) bool {
	locale, ok := c.Lookup("locale").StringValueOK()
	return ok && locale == "simple"
}

// MayRead: the resolver reads with the proxy's own credentials, so where
// the upstream enforces authorization it first asks, on the caller's own
// connection, whether the caller may read ns itself (a find that provably
// matches nothing). A caller who may not is refused before anything is
// resolved: resolution must reveal nothing the caller could not find out
// with its own authority (authority.Allows). It returns the refusal's
// detail, or "".
func (t *Targets) MayRead(ctx context.Context, req *proxy.Request, ns namespace.Namespace) string {
	if req == nil || t.cfg.Authority == nil || !t.cfg.Authority.Required() {
		return ""
	}
	allowed, err := t.cfg.Authority.Allows(ctx, req, authority.Read, ns)
	if err != nil {
		return fmt.Sprintf("its filter names no _id, and whether this connection may read %s could not be asked (%v)", ns, err)
	}
	if !allowed {
		return fmt.Sprintf("its filter names no _id, and this connection's user may not read %s, so the documents it matches cannot be looked up on its behalf; name the _id values", ns)
	}
	return ""
}

// ErrResolveSkipped: an audited write found no free resolver slot.
var ErrResolveSkipped = errors.New("resolution skipped")

// Resolve runs one resolution within the bounds: at most one per slot of
// slots at once, first come first served, the wait for a slot and the
// query together within ResolveTimeout. An enforced write waits for a
// slot; an audited one only takes a free slot, since nothing it could
// learn changes what is forwarded.
func (t *Targets) Resolve(ctx context.Context, slots chan struct{}, r policy.Rule, w policy.Write, limit int) (_ []docid.ID, spent time.Duration, _ error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.ResolveTimeout)
	defer cancel()
	if r.Mode == policy.Enforce {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			t.timedOut.Inc()
			return nil, 0, ctx.Err()
		}
	} else {
		select {
		case slots <- struct{}{}:
		default:
			t.skippedSeries.Inc()
			return nil, 0, ErrResolveSkipped
		}
	}
	defer func() { <-slots }()
	start := time.Now()
	ids, err := t.cfg.Resolver.Candidates(ctx, w.NS, w.Filter, w.Collation, w.Hint, limit)
	spent = time.Since(start)
	t.cfg.Seconds.Observe(spent.Seconds())
	switch {
	case err == nil:
		t.ok.Inc()
	case errors.Is(err, context.DeadlineExceeded) || IsMaxTimeExpired(err):
		t.timedOut.Inc()
	default:
		t.failed.Inc()
	}
	return ids, spent, err
}

// IsMaxTimeExpired reports MongoDB's MaxTimeMSExpired, the server's side
// of the resolution deadline.
func IsMaxTimeExpired(err error) bool {
	var se interface{ HasErrorCode(int) bool }
	return errors.As(err, &se) && se.HasErrorCode(int(mongoerr.MaxTimeMSExpired))
}

// IDCopy is the ID of one value of a request's buffer, with its own
// copy of the bytes.
func IDCopy(v bsoncore.Value) (docid.ID, error) {
	ids, err := docid.Copy([]bsoncore.Value{v})
	if err != nil {
		return docid.ID{}, err
	}
	return ids[0], nil
}

// callerKind says in a refusal whose budget ran out.
func callerKind(req *proxy.Request) string {
	if req != nil && req.Client != nil && req.Client.User() != "" {
		return "user"
	}
	return "client address"
}
