package guard

import (
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore"
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
	// Room for the usual write's flight (see enforce.Verdict's buffers).
	flightBuf flightPlan
	// owner is the lock owner the write acts as (writeOwner).
	owner lockstore.Owner
	// msg is the buffer the verdict's rewritten messages are encoded
	// into (ownMsg): the one field reset keeps. It holds no request: the
	// proxy's bytes are its own once handed back, and the next message
	// is encoded over them.
	msg *msgBuf
}

// reset clears v, every field, for the next write that gets it
// (putVerdict): it keeps no request alive, and the next write starts
// from nothing of this one's. As a whole, not field by field: cleared
// field by field (each a store or two, the pointers' behind a write
// barrier check) it took about 195 instructions where the whole
// verdict's loop takes about 150 (docs/BENCHMARKS.md, "the seventh
// box's core"). TestVerdictResetClearsEveryField holds any other way of
// clearing it to every field but msg, which the verdict keeps (ownMsg).
func (v *verdict) reset() {
	m := v.msg
	*v = verdict{}
	v.msg = m
}
