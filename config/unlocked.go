package config

import "slices"

// UnlockedWriters is what an enforced rule does with a write from a
// session that holds none of the locks it needs: a writer that was never
// converted to lockgate's lock commands (docs/ENFORCEMENT.md, "Writers
// that hold no lock").
type UnlockedWriters string

const (
	// UnlockedRefuse refuses it (LockBusy, not_locked): the default.
	UnlockedRefuse UnlockedWriters = "refuse"
	// UnlockedRefuseIfLocked lets it through under transient implicit
	// locks taken without waiting, and refuses it while anyone holds a
	// lock on a document it can touch.
	UnlockedRefuseIfLocked UnlockedWriters = "refuseIfLocked"
	// UnlockedWait queues it for implicit locks on every document it can
	// touch, first come first served with acquireLock's waiters, for at
	// most unlockedWaitMS.
	UnlockedWait UnlockedWriters = "wait"
)

// DefaultUnlockedWaitMS is the longest a write under unlockedWriters:
// wait queues for its implicit locks when the rule does not say.
const DefaultUnlockedWaitMS = 5000

// MaxUnlockedWaitMS bounds unlockedWaitMS: a legacy writer's request loop
// is blocked for that long, and most drivers time out well before.
const MaxUnlockedWaitMS = 300000

// UnlockedWritersModes lists the valid values, strictest first.
func UnlockedWritersModes() []UnlockedWriters {
	return []UnlockedWriters{UnlockedRefuse, UnlockedRefuseIfLocked, UnlockedWait}
}

// Valid reports whether u is one of UnlockedWritersModes.
func (u UnlockedWriters) Valid() bool { return slices.Contains(UnlockedWritersModes(), u) }

// validateUnlocked checks unlockedWriters, otherClientsUnlockedWriters and
// unlockedWaitMS of rule r under key.
func validateUnlocked(v *validator, key string, r NamespaceRule) {
	if r.UnlockedWriters != "" && !r.UnlockedWriters.Valid() {
		v.add(key+".unlockedWriters", "must be one of %s, got %q", list(UnlockedWritersModes()), r.UnlockedWriters)
	}
	if r.OtherClientsUnlockedWriters != "" {
		switch {
		case !r.OtherClientsUnlockedWriters.Valid():
			v.add(key+".otherClientsUnlockedWriters", "must be one of %s, got %q", list(UnlockedWritersModes()), r.OtherClientsUnlockedWriters)
		case r.Clients == nil && r.OtherClientsUnlockedWriters != UnlockedRefuse:
			v.add(key+".otherClientsUnlockedWriters", "is only used with clients; use unlockedWriters for every client")
		}
	}
	implicit := (r.UnlockedWriters != "" && r.UnlockedWriters != UnlockedRefuse) ||
		(r.OtherClientsUnlockedWriters != "" && r.OtherClientsUnlockedWriters != UnlockedRefuse)
	if implicit && r.Scheme != nil && r.Scheme.Type != "" && r.Scheme.Type != SchemeLockgate {
		// A scheme's locks live in the application's documents; implicit
		// locks are lockgate's own, which the scheme's holders never see.
		v.add(key+".unlockedWriters", "is not supported with scheme %q: implicit locks are lockgate's own locks, which the scheme's lock holders do not take", r.Scheme.Type)
	}
	if r.UnlockedWaitMS < 0 || r.UnlockedWaitMS > MaxUnlockedWaitMS {
		v.add(key+".unlockedWaitMS", "must be between 0 (default %d) and %d milliseconds, got %d", DefaultUnlockedWaitMS, MaxUnlockedWaitMS, r.UnlockedWaitMS)
	} else if r.UnlockedWaitMS != 0 && r.UnlockedWriters != UnlockedWait && r.OtherClientsUnlockedWriters != UnlockedWait {
		v.add(key+".unlockedWaitMS", "is only used with unlockedWriters: %s (or otherClientsUnlockedWriters: %s); remove it", UnlockedWait, UnlockedWait)
	}
}
