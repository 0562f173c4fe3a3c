package inflight

import (
	"slices"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
)

// An operator's force-release and a lock holder's write meet the same way
// (below): the write reads ForceSeq before its lock check, and its launch
// (Launch, under mu) is refused if a force-release of one of its locks
// was under way at any moment since. Either the force-release finds the
// write in flight and waits for it, or the write finds the force-release.
// The cost on the hot path is one atomic read and, at the launch, a look
// at forced: empty but for the rare force-release, and past one only a
// comparison of sequence numbers per entry remembered (keepForced at most,
// with those under way).

// An operator's force-release and a legacy write's implicit locks meet
// here (Dekker's pattern, under the tracker's mu): the force-release
// records that it is under way (Forcing) before it looks for writes under
// the lock (WaitKey), and a write records its implicit locks (Took) once
// they are taken, checking for a force-release of them under way since it
// started taking them. Either the force-release sees the write and waits
// for it, or the write sees the force-release and is refused: a lock freed
// between its grant and its write's launch would let the write leave
// afterwards, under a lease of its own reckoning, into the work of
// whoever took the document meanwhile. A write that merely waits for a
// lock (unlockedWriters: wait) holds nothing and delays no force-release.

// keepForced is how many ended force-releases the tracker remembers for
// lock holders' writes checked before they ended and not yet launched.
const keepForced = 64

// forcedKey is a force-release under way (end 0) or ended at seq end.
type forcedKey struct {
	ns  namespace.Namespace
	id  docid.ID
	end uint64
}

// Forcing records a force-release of (ns, id) as under way; the returned
// func records its end.
func (t *Tracker) Forcing(ns namespace.Namespace, id docid.ID) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forcing.Add(1)
	t.forceSeq.Add(1)
	e := &forcedKey{ns: ns, id: id}
	t.forced = append(t.forced, e)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		e.end = t.forceSeq.Add(1)
		t.forcing.Add(-1)
		t.pruneForcedLocked()
	}
}

// StartTaking records that a write starts taking implicit locks; Took or
// StopTaking must follow with the seq returned.
func (t *Tracker) StartTaking() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.taking == nil {
		t.taking = map[uint64]int{}
	}
	seq := t.forceSeq.Load()
	t.taking[seq]++
	return seq
}

// StopTaking ends StartTaking without locks taken.
func (t *Tracker) StopTaking(seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopTakingLocked(seq)
}

func (t *Tracker) stopTakingLocked(seq uint64) {
	if t.taking[seq]--; t.taking[seq] <= 0 {
		delete(t.taking, seq)
	}
	t.pruneForcedLocked()
}

// Took records the implicit locks on ids in ns, taken by owner since
// StartTaking returned seq, in *pending (a Flight made on first use, that
// stands for the write under its owner's session), so that WaitKey waits
// for the write until it is launched (its own Flight stands for it then)
// or the locks are given back (Unhold). *pending is guarded by the
// tracker. It reports false, recording nothing, when a force-release of
// one of them was under way at any moment since seq: the lock may have
// been freed after it was granted.
func (t *Tracker) Took(pending **Flight, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.stopTakingLocked(seq)
	for _, e := range t.forced {
		if e.ns.String() != ns.String() || (e.end != 0 && e.end <= seq) {
			continue
		}
		for _, id := range ids {
			if id.Equal(e.id) {
				return false
			}
		}
	}
	f := *pending
	if f == nil {
		f = &Flight{}
		f.SetOwner(owner)
		sf := t.sessionLocked(owner.Session)
		f.sf = sf
		sf.add(f) // not dropped: t.mu is held
		*pending = f
	}
	// WaitKey reads a flight's locks under its session's mutex.
	f.sf.mu.Lock()
	f.Locks.Add(ns, slices.Clone(ids))
	f.sf.mu.Unlock()
	return true
}

// forcedSinceLocked reports whether a force-release of one of locks was
// under way at any moment since seq, or may have been (one forgotten
// since); t.mu is held.
func (t *Tracker) forcedSinceLocked(locks Locks, seq uint64) bool {
	if seq < t.forgotten {
		return true
	}
	for _, e := range t.forced {
		if e.end != 0 && e.end <= seq {
			continue
		}
		for _, id := range locks.Get(e.ns) {
			if id.Equal(e.id) {
				return true
			}
		}
	}
	return false
}

// pruneForcedLocked forgets the ended force-releases that no write still
// taking locks can have met, but for the last keepForced of them: a lock
// holder's write checked before one ended and not yet launched may need
// it, and is refused, rather than trusted, once it is forgotten (a write
// would have to be held past keepForced force-releases); t.mu is held.
func (t *Tracker) pruneForcedLocked() {
	if len(t.forced) <= keepForced {
		return
	}
	oldest, any := uint64(0), false
	for seq := range t.taking {
		if !any || seq < oldest {
			oldest, any = seq, true
		}
	}
	var ends []uint64
	for _, e := range t.forced {
		if e.end != 0 && (!any || e.end <= oldest) {
			ends = append(ends, e.end)
		}
	}
	if len(ends) <= keepForced {
		return
	}
	slices.Sort(ends)
	last := ends[len(ends)-keepForced-1] // ends are distinct
	t.forced = slices.DeleteFunc(t.forced, func(e *forcedKey) bool { return e.end != 0 && e.end <= last })
	t.forgotten = max(t.forgotten, last)
}

// Unhold ends Took's registration in *pending, if any.
func (t *Tracker) Unhold(pending **Flight) {
	t.mu.Lock()
	f := *pending
	*pending = nil
	t.mu.Unlock()
	if f != nil {
		t.remove(f)
	}
}

// Remembered returns how many force-releases the tracker remembers, and
// its bound on the ended ones, for checks that the memory stays bounded
// however many force-releases a proxy sees.
func (t *Tracker) Remembered() (n, bound int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.forced), keepForced
}
