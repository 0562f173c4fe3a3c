package guard

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// record writes the audit trail of one decision: a log line for every
// namespace the message writes under an audited or enforced rule, the
// decision counters, labelled by rule (a bounded set), never by namespace
// or id, and the audit trail's records. Where an allowed write's rule
// requires its audit record (auditRequired, audit.mode required), record
// waits until the record is durable, and returns the violation that
// refuses the write when it cannot be (fail closed); nil otherwise.
func (g *Guard) record(req *proxy.Request, pol *policy.Policy, v *verdict, enforced *enforce.Violation, took time.Duration) (unaudited *enforce.Violation) {
	return g.recordAt(req, pol, v, enforced, took, time.Time{})
}

// recordAt is record with the decision's end read by the caller: the
// decision lines' time, zero to read it when they are written.
func (g *Guard) recordAt(req *proxy.Request, pol *policy.Policy, v *verdict, enforced *enforce.Violation, took time.Duration, now time.Time) (unaudited *enforce.Violation) {
	g.metrics.decisionSeconds.Observe(took.Seconds())
	if len(v.Violations) == 0 && len(v.Writes) == 1 && len(v.Rules) == 1 {
		// The usual write, one namespace under the rule enforce looked
		// up: what the loops below do for it, without their closure and
		// its list of namespaces logged.
		return g.recordNS(req, pol, v, &v.Writes[0], &v.Rules[0], nil, enforced, nil, took, now)
	}
	var seenBuf [4]string
	seen := seenBuf[:0] // namespaces logged; a message writes very few
	logNS := func(w *policy.Write, r *policy.Rule, x *enforce.Violation) {
		if slices.Contains(seen, w.NS.String()) {
			return
		}
		seen = append(seen, w.NS.String())
		unaudited = g.recordNS(req, pol, v, w, r, x, enforced, unaudited, took, now)
	}
	for i := range v.Violations {
		x := &v.Violations[i]
		logNS(&x.Write, &x.Rule, x)
	}
	for i := range v.Writes {
		if len(v.Rules) == len(v.Writes) {
			logNS(&v.Writes[i], &v.Rules[i], nil) // the rule enforce looked up
		} else {
			r := g.ruleFor(pol.Lookup(v.Writes[i].NS), req)
			logNS(&v.Writes[i], &r, nil)
		}
	}
	return unaudited
}

// recordNS records the decision of one namespace w of the message: its
// violation x, if any, enforced the message's first enforced one. It
// returns unaudited, or the violation that refuses the write for want of
// its audit record.
func (g *Guard) recordNS(req *proxy.Request, pol *policy.Policy, v *verdict, w *policy.Write, r *policy.Rule, x, enforced, unaudited *enforce.Violation, took time.Duration, now time.Time) *enforce.Violation {
	decision, reason := enforce.DecisionAllow, ""
	if x != nil {
		reason = x.Reason
		decision = enforce.DecisionWouldReject
		if enforced != nil {
			decision = enforce.DecisionReject
		}
	}
	if t := g.opts.Trail; t != nil {
		if y := g.trailRecord(t, req, pol, v, w, r, x, decision, now, x != nil || enforced != nil || unaudited != nil); y != nil {
			// Refused for want of a record: the counters, the log
			// line and (if it can take one) the trail say so.
			x, unaudited, decision, reason = y, y, enforce.DecisionReject, y.Reason
		}
	}
	st := v.conn(req)
	if st != nil && decision == enforce.DecisionAllow {
		// The usual decision's series, looked up once per rule
		// and connection: the labels' hash costs more than the add.
		st.allowCounter(g.metrics.decisions, r.Match).Inc()
	} else {
		g.metrics.decisions.WithLabelValues(r.Match, decision, metricReason(reason)).Inc()
	}
	// The line's fields (id lists above all) cost more than the
	// decision itself; build them only when the line is written.
	switch {
	case g.lines == nil:
		g.zapLine(st, req, pol, v, w, r, x, decision, reason, took)
	case g.lines.on:
		g.appendLine(st, req, pol, v, w, r, x, decision, took, now)
	}
	if st != nil {
		st.unlock(req)
	}
	return unaudited
}

// trailRecord appends the trail's record of one namespace's decision, or,
// for an allowed write whose rule requires its record (unless plain:
// refused, audited or not required), waits until it is durable; the
// violation back refuses the write for want of it (and is recorded).
// Kept out of record's loop, whose frame it would otherwise enlarge on
// every write.
func (g *Guard) trailRecord(t AuditTrail, req *proxy.Request, pol *policy.Policy, v *verdict, w *policy.Write, r *policy.Rule, x *enforce.Violation, decision string, now time.Time, plain bool) *enforce.Violation {
	ev := g.trailEvent(req, pol, v, w, r, x, decision, now)
	switch {
	case x == nil && v.AuditDone:
		// Its allow record was made durable before the step ran.
	case plain || r.Mode != policy.Enforce || !(r.AuditRequired || g.opts.AuditRequired):
		t.Append(ev)
	default:
		if x = g.commitRecord(t, ev, *w, *r); x != nil {
			t.Append(g.trailEvent(req, pol, v, w, r, x, enforce.DecisionReject, now))
			return x
		}
	}
	return nil
}

// zapLine writes the decision line of one namespace through the guard's
// logger (without a LineSink), from the connection's pre-encoded fields
// when st (locked) is set.
func (g *Guard) zapLine(st *connState, req *proxy.Request, pol *policy.Policy, v *verdict, w *policy.Write, r *policy.Rule, x *enforce.Violation, decision, reason string, took time.Duration) {
	if !g.audit.Core().Enabled(zap.InfoLevel) {
		return
	}
	command, lsid := lineCommand(req, v)
	var ce *zapcore.CheckedEntry
	fp := g.auditFields.Get().(*[]zap.Field) // room for every field below
	fields := (*fp)[:0]
	if st != nil {
		// The fields that stay the same from one write of the
		// connection to the next are encoded once.
		ce = st.decisionLogger(g.audit, req.Client.Addr, req.Client.AppName(), req.Client.User(), lsid, w.NS.String(), command, string(r.Mode)).Check(zap.InfoLevel, "decision")
	} else {
		var session string
		if lsid != nil {
			session = lockstore.SessionPrefix(lsid)
		}
		ce = g.audit.Check(zap.InfoLevel, "decision")
		fields = append(fields,
			zap.String("client", req.Client.Addr),
			zap.String("app", req.Client.AppName()),
			zap.String("user", req.Client.User()),
			zap.String("session", session),
			zap.String("ns", w.NS.String()),
			zap.String("command", command),
			zap.String("mode", string(r.Mode)))
	}
	if ce == nil {
		g.auditFields.Put(fp)
		return
	}
	fields = append(fields,
		zap.String("decision", decision),
		zap.String("policyVersion", pol.Version()),
		zap.Duration("took", took))
	if ids, ok := v.Checked.Lookup(w.NS); ok {
		if st != nil {
			fields = append(fields, zap.String("ids", st.memo().idText(ids)))
		} else {
			fields = append(fields, zap.String("ids", idList(ids)))
		}
	}
	if m := v.implicitMode(); m != "" {
		fields = append(fields, zap.String("implicit", m))
	}
	if v.LockState != "" && x == nil {
		fields = append(fields, zap.String("lockState", v.LockState))
	}
	if x != nil {
		fields = append(fields, zap.String("reason", reason), zap.String("detail", x.Detail))
		if len(x.IDs) > 0 {
			fields = append(fields, zap.String("ids", idList(x.IDs)))
		}
	}
	ce.Write(fields...)
	// Cores encode or copy the fields in Write (zap's do), so the
	// slice is free again.
	clear(fields)
	*fp = fields[:0]
	g.auditFields.Put(fp)
}

// lineCommand is the command a decision line names, and the session id
// whose tag it shows (nil for none).
func lineCommand(req *proxy.Request, v *verdict) (command string, lsid []byte) {
	if req.Command == nil {
		return req.Message.Header().OpCode.String(), nil
	}
	if v.LSID != nil {
		return req.Command.Name, v.LSID
	}
	if sid, ok := req.Command.SessionID(); ok {
		return req.Command.Name, sid
	}
	return req.Command.Name, nil
}

// appendLine writes the decision line of one namespace through the
// guard's LineSink: the fields record gives zap, in the same order, from
// the connection's pre-encoded head when st (locked) is set.
//
// Only the usual line (the connection's latest allowed line again, its
// one id's field from the memo) is written here; what any other line
// needs is in functions of their own, not inlined, so that the usual
// line's code is a few contiguous cache lines (docs/BENCHMARKS.md, "the
// thirteenth box's code footprint").
func (g *Guard) appendLine(st *connState, req *proxy.Request, pol *policy.Policy, v *verdict, w *policy.Write, r *policy.Rule, x *enforce.Violation, decision string, took time.Duration, now time.Time) {
	if now.IsZero() {
		now = time.Now()
	}
	command, lsid := lineCommand(req, v)
	var b []byte
	var pooled *[]byte
	started := false
	// The usual line: everything but its time's fraction, took and ids
	// from the memos; the connection's latest allowed line's text when
	// its fields are the same (again).
	keyed := st != nil && decision == enforce.DecisionAllow && len(lsid) == len(allowKey{}.lsid)
	if keyed {
		if al := &st.memo().allow; al.keyed && al.key.is(req.Client, lsid, w, command, r) {
			b, started = al.again(g.lines, st.line, now, &st.ts, pol, &st.held)
		}
	}
	if !started {
		b, pooled = g.startLine(st, req, pol, w, r, decision, now, command, lsid, keyed)
	}
	b = append(appendDuration(b, took), '"')
	if ids, ok := v.Checked.Lookup(w.NS); ok {
		var f []byte
		if len(ids) == 1 && st != nil {
			f = st.memo().idField(ids)
		}
		if f != nil {
			b = append(b, f...)
		} else {
			b = appendLineIDs(st, b, ids)
		}
	}
	if v.implicit != nil || v.LockState != "" || x != nil {
		b = appendLineOutcome(b, v, x)
	}
	b = g.lines.write(b, now)
	if st != nil {
		st.line = b
	} else {
		*pooled = b
		g.lines.bufs.Put(pooled)
	}
}

// startLine is a decision line up to its took's value, for any line but
// the connection's latest allowed line again: from the connection's
// head, or, without st, in a pooled buffer (returned, to be put back).
//
//go:noinline
func (g *Guard) startLine(st *connState, req *proxy.Request, pol *policy.Policy, w *policy.Write, r *policy.Rule, decision string, now time.Time, command string, lsid []byte, keyed bool) (b []byte, pooled *[]byte) {
	started := false
	if st != nil {
		head, tail := st.lineHead(req.Client.Addr, req.Client.AppName(), req.Client.User(), lsid, w.NS.String(), command, string(r.Mode))
		if decision == enforce.DecisionAllow {
			al := &st.memo().allow
			b, started = al.startAllowed(g.lines, st.line, now, &st.ts, head, tail, pol, st.versionField(pol), &st.held)
			var key allowKey
			if started && keyed {
				key = allowKeyOf(req.Client, lsid, w, command, r)
			}
			al.remember(&key, started && keyed)
		}
		if !started {
			st.held = lineHeld{} // the buffer's line is another one now
			b = append(append(g.lines.start(st.line, now, &st.ts), head...), tail...)
		}
	} else {
		pooled = g.lines.bufs.Get().(*[]byte)
		b = g.lines.start(*pooled, now, nil)
		b = appendLineHead(b, req.Client.Addr, req.Client.AppName(), req.Client.User(), lsid, w.NS.String(), command, string(r.Mode))
	}
	if started {
		return b, pooled
	}
	// The keys, and the decision, need no escaping: appended as they are.
	switch decision {
	case enforce.DecisionAllow:
		b = append(b, `,"decision":"allow"`...)
	default:
		b = appendField(b, "decision", decision)
	}
	if st != nil {
		b = append(b, st.versionField(pol)...)
	} else {
		b = appendJSONString(append(b, `,"policyVersion":`...), pol.Version())
	}
	return append(b, `,"took":"`...), pooled
}

// appendLineIDs appends a line's ids field where the memo has none made
// (idField): one id's field into the connection's scratch, or the list.
//
//go:noinline
func appendLineIDs(st *connState, b []byte, ids []docid.ID) []byte {
	switch {
	case len(ids) == 1 && st != nil:
		var done bool
		b, st.idScratch, done = appendIDField(b, st.idScratch, "ids", ids[0])
		if cap(st.idScratch) > maxKeptLine {
			st.idScratch = nil // a huge _id's text is not kept
		}
		if done {
			return b
		}
		return appendField(b, "ids", st.memo().idText(ids))
	case st != nil:
		return appendField(b, "ids", st.memo().idText(ids))
	default:
		return appendField(b, "ids", idList(ids))
	}
}

// appendLineOutcome appends what a line says besides the usual allowed
// write's fields: the implicit locks' mode, the scheme's lock state, the
// refusal.
//
//go:noinline
func appendLineOutcome(b []byte, v *verdict, x *enforce.Violation) []byte {
	if m := v.implicitMode(); m != "" {
		b = appendField(b, "implicit", m)
	}
	if v.LockState != "" && x == nil {
		b = appendField(b, "lockState", v.LockState)
	}
	if x != nil {
		b = appendField(b, "reason", x.Reason)
		b = appendField(b, "detail", x.Detail)
		if len(x.IDs) > 0 {
			b = appendField(b, "ids", idList(x.IDs))
		}
	}
	return b
}

// AuditTrail takes the records of the tamper-evident audit trail;
// *audittrail.Trail is one. Append must not block: it is called on the
// request path, once per protected namespace a message writes. Commit
// returns once the record is durable, or fails; it is called only for
// allowed writes whose rule requires their record.
type AuditTrail interface {
	Append(audittrail.Event) bool
	Commit(context.Context, audittrail.Event) error
}

// reasonAuditUnavailable refuses an allowed write whose rule requires an
// audit record that the trail could not make durable.
const reasonAuditUnavailable = "audit_unavailable"

// auditCommitTimeout bounds the wait for a required audit record: a
// trail that cannot write within it refuses the write.
const auditCommitTimeout = 5 * time.Second

// trailEvent is the trail's record of one decision. It only copies
// references (the ids are formatted by the trail's writer, off this
// path); at is the decision's end, zero to read the clock; the one lookup is the holder tag, which the lock store's
// records and the lock view show too, so that one holder's locks and
// writes can be followed together.
func (g *Guard) trailEvent(req *proxy.Request, pol *policy.Policy, v *verdict, w *policy.Write, r *policy.Rule, x *enforce.Violation, decision string, at time.Time) audittrail.Event {
	if at.IsZero() {
		at = time.Now()
	}
	ev := audittrail.Event{Kind: audittrail.KindDecision, Time: at, NS: w.NS.String(), Mode: string(r.Mode),
		Verdict: trailVerdict(decision), Policy: pol.Version(),
		App: req.Client.AppName(), User: req.Client.User(), Client: req.Client.Addr}
	if req.Command == nil {
		ev.Op = req.Message.Header().OpCode.String()
	} else {
		ev.Op = req.Command.Name
		// The tag's bytes, by value: the writer writes them in hex
		// (lockstore.SessionPrefix's form).
		switch {
		case v.flight != nil:
			ev.HolderTag = audittrail.TagOf(v.flight.Owner.Session)
		case v.LSID != nil:
			ev.HolderTag = audittrail.TagOf(g.owners.Session(ev.User, v.LSID))
		default:
			if sid, ok := req.Command.SessionID(); ok {
				ev.HolderTag = audittrail.TagOf(g.owners.Session(ev.User, sid))
			}
		}
	}
	if ids, ok := v.Checked.Lookup(w.NS); ok {
		ev.IDs = ids
	} else if len(v.Writes) == 1 {
		ev.IDs = v.Named // one namespace: the ids the request names are its
	}
	if len(ev.IDs) == 0 {
		ev.IDs = insertedIDs(v.Writes, w.NS) // inserts that needed no lock check
	}
	if x != nil {
		ev.Reason, ev.Detail = x.Reason, x.Detail
		if len(x.IDs) > 0 {
			ev.IDs = x.IDs
		}
	} else if m := v.implicitMode(); m != "" {
		ev.Detail = implicitDetail(m)
	} else if v.LockState != "" {
		ev.Detail = "scheme lock state: " + v.LockState
	}
	if v.fence != nil && x == nil && len(ev.IDs) > 0 {
		// A fenced write ran under these tokens (fence.go).
		ev.Tokens = make([]int64, len(ev.IDs))
		for i, id := range ev.IDs {
			ev.Tokens[i], _ = v.fence.token(w.NS, id)
		}
	}
	return ev
}

// insertedIDs are the _id values of the documents the message inserts
// into ns, copied: the message's buffer is not the trail's to keep.
func insertedIDs(writes []policy.Write, ns namespace.Namespace) []docid.ID {
	var vals []bsoncore.Value
	for i := range writes {
		if writes[i].NS.String() != ns.String() || writes[i].Doc == nil {
			continue
		}
		if id, err := writes[i].Doc.LookupErr("_id"); err == nil {
			vals = append(vals, id)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	ids, err := docid.Copy(vals)
	if err != nil {
		return nil
	}
	return ids
}

// trailVerdict is a decision of the decision log as the trail names it.
func trailVerdict(decision string) string {
	switch decision {
	case enforce.DecisionAllow:
		return audittrail.VerdictAllow
	case enforce.DecisionReject:
		return audittrail.VerdictReject
	case enforce.DecisionWouldReject:
		return audittrail.VerdictWouldReject
	}
	return ""
}

// commitRecord waits until ev is durable; when it cannot be, it returns
// the violation that refuses the write.
func (g *Guard) commitRecord(t AuditTrail, ev audittrail.Event, w policy.Write, r policy.Rule) *enforce.Violation {
	ctx, cancel := context.WithTimeout(context.Background(), auditCommitTimeout)
	defer cancel()
	err := t.Commit(ctx, ev)
	if err == nil {
		return nil
	}
	return &enforce.Violation{Rule: r, Write: w, Reason: reasonAuditUnavailable, IDs: ev.IDs,
		Detail: fmt.Sprintf("its rule requires an audit record and the audit trail cannot take it (%v)", err),
		Advice: "retry when the audit trail is writable again (lockgate_audit_sink_errors_total, the log of component audit); nothing was written"}
}

// commitSchemeStep makes durable, before lockgate runs a scheme step
// itself (an acquire, a release, a write it pins to the holder), the
// allow record of that step's write when its rule requires one: the
// step's statement reaches the database only after its record. It
// returns the violation that refuses the write when the trail cannot take
// the record; nothing has been sent or taken then.
func (g *Guard) commitSchemeStep(req *proxy.Request, pol *policy.Policy, v *verdict, r policy.Rule, w policy.Write) *enforce.Violation {
	t := g.opts.Trail
	if t == nil || r.Mode != policy.Enforce || !(r.AuditRequired || g.opts.AuditRequired) {
		return nil
	}
	if x := g.commitRecord(t, g.trailEvent(req, pol, v, &w, &r, nil, enforce.DecisionAllow, time.Time{}), w, r); x != nil {
		return x
	}
	v.AuditDone = true
	return nil
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
var metricReasons = []string{enforce.ReasonNotLocked, enforce.ReasonHeldByOther, enforce.ReasonInsertLocked, enforce.ReasonCollectionWrite,
	enforce.ReasonUnclassifiable, enforce.ReasonTooManyCandidates, enforce.ReasonResolveFailed,
	enforce.ReasonUnverifiableUpsert, refuse.ReasonNoSession, refuse.ReasonUnavailable,
	reasonSchemeNotFollowed, reasonSchemeNotHolder, reasonAuditUnavailable, reasonImplicitTimeout, "other"}
