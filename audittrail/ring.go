package audittrail

import "sync/atomic"

// ring is the bounded buffer between the request path and the writer: a
// fixed array of slots allocated once, which any number of producers
// fill and one consumer (the writer goroutine) empties, without a lock
// and without allocating (a bounded queue after Dmitry Vyukov's). A
// producer claims the next position with one compare-and-swap, copies
// its item into the slot and publishes it by storing the slot's
// sequence; the consumer takes slots in position order once published
// and hands each back by moving its sequence one lap on. A full ring
// refuses at once: put never waits.
type ring struct {
	slots []slot
	// head is the next position a producer claims; tail the next the
	// consumer takes (the writer goroutine's alone, atomic for the
	// metric that reads the length).
	head atomic.Uint64
	_    [56]byte // head and tail on separate cache lines
	tail atomic.Uint64
}

// slot holds one item. seq == pos: free for the producer of position
// pos; seq == pos+1: published, for the consumer.
type slot struct {
	seq atomic.Uint64
	it  item
}

func newRing(n int) *ring {
	r := &ring{slots: make([]slot, n)}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// put copies the event (and done) into the ring; false when the ring is
// full.
func (r *ring) put(ev *Event, done chan error) bool {
	n := uint64(len(r.slots))
	pos := r.head.Load()
	for {
		s := &r.slots[pos%n]
		seq := s.seq.Load()
		switch d := int64(seq - pos); {
		case d == 0:
			if r.head.CompareAndSwap(pos, pos+1) {
				s.it.ev, s.it.done = *ev, done
				s.seq.Store(pos + 1)
				return true
			}
			pos = r.head.Load()
		case d < 0:
			// The slot still holds the item of the lap before: full.
			return false
		default:
			pos = r.head.Load() // another producer took pos
		}
	}
}

// take appends the published items, in order, to batch, up to max in
// all, emptying their slots; only the writer goroutine calls it. It stops
// at a slot claimed but not yet published (its producer is copying):
// that item comes with the next take.
func (r *ring) take(batch []item, max int) []item {
	n := uint64(len(r.slots))
	pos := r.tail.Load()
	for len(batch) < max {
		s := &r.slots[pos%n]
		if s.seq.Load() != pos+1 {
			break
		}
		batch = append(batch, s.it)
		s.it = item{} // the event's slices are the trail's no more
		s.seq.Store(pos + n)
		pos++
	}
	r.tail.Store(pos)
	return batch
}

// empty reports whether no published item waits at the consumer's
// position.
func (r *ring) empty() bool {
	pos := r.tail.Load()
	return r.slots[pos%uint64(len(r.slots))].seq.Load() != pos+1
}

// len is how many positions are claimed and not yet taken.
func (r *ring) len() int {
	t := r.tail.Load() // first: head only grows, so head >= t
	return int(r.head.Load() - t)
}
