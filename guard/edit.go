package guard

import (
	"errors"
	"fmt"

	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// edit applies an allowed write's edits (its pins, its fences and the
// maxTimeMS cap) to d in one pass: policy.EditMessage encodes the message
// at most once, and d keeps forwarding the original bytes when nothing
// changes. When the write is capped, d.MaxTime is where its maxTimeMS
// lies in the bytes to send, for the proxy to lower to what is left when
// they leave. It returns false, d made a refusal, when the write cannot
// be edited as it must be (then d's reply hook is abandoned): refusing is
// the only safe answer in enforce mode. d is edited in place: the
// decision is about 20 words, copied at every call that takes it by value.
//
// The message is encoded into a buffer (msgBuf), which the proxy hands
// back once it has written it (d.MessageDone): with own, the verdict's
// (verdict.msg, kept while the verdict goes round: own is for a verdict
// that goes back to the spares when its flight lands), else one of the
// guard's msgBufs.
func (g *Guard) edit(req *proxy.Request, pol *policy.Policy, v *verdict, d *proxy.Decision, ed *policy.Edit, own bool) bool {
	var m *msgBuf
	if own {
		m = v.ownMsg()
	} else if m, _ = g.msgBufs.Get().(*msgBuf); m == nil {
		m = &msgBuf{spare: &g.msgBufs}
	}
	ed.Buf, m.b = m.b, nil
	b, _, at, err := ed.MessageAt(req.Message, req.Command)
	if err == nil && b != nil && len(b) > g.opts.MaxMessageSize && (len(ed.Pins) > 0 || len(ed.Fences) > 0) {
		err = errTooLarge
	}
	if err != nil {
		if d.OnReply != nil {
			d.OnReply.Abandon()
		}
		*d = proxy.Decision{Action: proxy.Reply, Reply: refusal(req, g.editViolation(pol, v, *ed, err)).Document()}
		return false
	}
	if len(ed.Pins) > 0 {
		g.metrics.pinned.Inc()
	}
	d.MaxTime = at
	switch {
	case b == nil:
		m.b = ed.Buf[:0]
		if !own {
			g.msgBufs.Put(m)
		}
	default:
		if own && cap(b) <= maxKeptMessage {
			// The verdict's buffer is these bytes again once they are
			// handed back (ownMsg asks out first): kept now, so that the
			// release writes nothing but out.
			m.b = b[:0]
		}
		d.Action, d.Message = proxy.Rewrite, b
		m.out.Store(true)
		d.MessageDone = m
	}
	return true
}

// errTooLarge: the edited message exceeds the upstream's message limit.
var errTooLarge = errors.New("edited message too large")

// editViolation explains why an allowed write could not be edited, naming
// the edit that could not be made.
func (g *Guard) editViolation(pol *policy.Policy, v *verdict, ed policy.Edit, err error) enforce.Violation {
	w := v.Writes[0]
	if len(ed.Fences) > 0 {
		w = v.fence.stmts[0].w
	}
	x := enforce.Violation{Write: w, Rule: pol.Lookup(w.NS), Reason: enforce.ReasonUnclassifiable}
	switch {
	case errors.Is(err, errTooLarge) && len(ed.Fences) > 0:
		x.Reason = enforce.ReasonTooManyCandidates
		x.Detail = fmt.Sprintf("fenced, it would exceed the %d-byte message limit; write fewer documents per command", g.opts.MaxMessageSize)
	case errors.Is(err, errTooLarge):
		x.Reason = enforce.ReasonTooManyCandidates
		x.Detail = fmt.Sprintf("restricted to its %d verified documents it would exceed the %d-byte message limit; narrow the filter", len(ed.Pins[0].IDs), g.opts.MaxMessageSize)
	case errors.Is(err, policy.ErrFenceField):
		x.Reason, x.Detail = reasonFenceField, err.Error()
	case len(ed.Fences) > 0:
		x.Detail = fmt.Sprintf("the proxy could not restrict it to the current lock holder's documents (%v)", err)
	case len(ed.Pins) > 0:
		x.Detail = fmt.Sprintf("the proxy could not restrict it to the verified documents (%v)", err)
	default:
		x.Detail = fmt.Sprintf("the proxy could not bound its running time by the lease (%v)", err)
	}
	return x
}
