package lockstore

import (
	"fmt"
	"time"
)

// Defaults applied by Config.withDefaults.
const (
	DefaultDatabase          = "lockgate"
	DefaultCollection        = "locks"
	DefaultLease             = 30 * time.Second
	DefaultMaxLease          = 10 * time.Minute
	DefaultCleanupAfter      = 10 * time.Minute
	DefaultOpTimeout         = 5 * time.Second
	DefaultCacheTrust        = time.Second
	DefaultClockSyncInterval = 10 * time.Second
	DefaultMinPoll           = 5 * time.Millisecond
	DefaultMaxPoll           = 50 * time.Millisecond
	// MinCleanupAfter is the shortest time a superseded generation is kept
	// before compaction deletes it. It must exceed by far the longest store
	// operation (see docs/LOCKS.md), so it is also at least 12 x OpTimeout.
	MinCleanupAfter = time.Minute
)

// DefaultMaxLocksPerSession is Config.MaxLocksPerSession's default.
const DefaultMaxLocksPerSession = 10000

// Config configures a Store. Zero values take the defaults above.
type Config struct {
	// URI of the deployment that keeps the lock records (required).
	URI string
	// Database and Collection of the lock records.
	Database   string
	Collection string
	// DefaultLease applies when a caller asks for lease 0; MaxLease is the
	// longest lease a caller may ask for.
	DefaultLease time.Duration
	MaxLease     time.Duration
	// TakeoverGrace keeps a lock whose lease ended without a release from
	// a new owner for this long after the lease end; 0 means none.
	TakeoverGrace time.Duration
	// CleanupAfter is how long a superseded generation of a lock key is kept
	// before compaction deletes it (the head generation of a key is never
	// deleted); at least MinCleanupAfter and 12 x OpTimeout.
	CleanupAfter time.Duration
	// CleanupInterval is how often this Store compacts; 0 means
	// CleanupAfter/4 (at least a minute), negative disables the janitor.
	CleanupInterval time.Duration
	// OpTimeout bounds each round trip to the store (and server selection),
	// so that an unreachable store fails quickly with ErrUnavailable.
	OpTimeout time.Duration
	// CacheTrust is how long Holds may answer from the local cache after the
	// record was last written or read through this Store; negative disables
	// the cache (every Holds reads the database).
	CacheTrust time.Duration
	// NewcomerHorizon (G) is how long a Store that finds other Stores
	// registered when it starts grants nothing, counted from its
	// registration's acknowledgement (instances.go); 0 means
	// DefaultNewcomerHorizon. It is what lets a Store that is alone hold a
	// legacy write's implicit lock in memory (memlock.go): such a write's
	// maxTimeMS is capped below G − CacheTrust, so it has surely ended
	// before a newcomer grants. A negative value, or one too short to
	// leave such writes a quarter second, turns memory locks off, and the
	// newcomer then waits CacheTrust as without them.
	NewcomerHorizon time.Duration
	// ClockSyncInterval is how often the server clock offset is re-measured.
	ClockSyncInterval time.Duration
	// MinPoll and MaxPoll bound the jittered exponential backoff with which
	// waiters poll for locks released through other instances. MaxPoll
	// bounds how late a release elsewhere is noticed (its default keeps the
	// median handoff across two proxies well under 50 ms) and sets the
	// read rate: one head read per c/2..c, about 27 a second per waiting
	// key and instance at the default.
	MinPoll time.Duration
	MaxPoll time.Duration
	// MaxWaiters bounds the waiting acquires per lock on this instance, so
	// that one client cannot queue unbounded work on a key; 0 means 1000.
	MaxWaiters int
	// MaxLocksPerSession bounds the unexpired locks one session may hold
	// through this instance; an acquire beyond it fails with
	// ErrTooManyLocks and takes nothing. 0 means 10000; negative means no
	// limit.
	MaxLocksPerSession int
	// AppName is the driver's application name for the store's own client.
	AppName string
	// MaxPoolSize bounds the store client's connection pool; 0 keeps the
	// driver's default (100). A small pool helps servers that serialize
	// writes badly (FerretDB on SQLite).
	MaxPoolSize uint64
	// WakeListen, when set ("host:port", host the address other lockgates
	// reach this one at; port 0 picks one), is where this Store listens
	// for wake-up datagrams from other Stores, so that a release through
	// one wakes a waiter on another at once instead of at its next poll
	// (wake.go). Empty: waiters on other instances poll only.
	WakeListen string
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.Collection == "" {
		c.Collection = DefaultCollection
	}
	if c.AppName == "" {
		c.AppName = "lockgate-lockstore"
	}
	def(&c.DefaultLease, DefaultLease)
	def(&c.MaxLease, DefaultMaxLease)
	def(&c.CleanupAfter, DefaultCleanupAfter)
	if c.CleanupInterval == 0 {
		c.CleanupInterval = max(c.CleanupAfter/4, time.Minute)
	}
	def(&c.OpTimeout, DefaultOpTimeout)
	def(&c.CacheTrust, DefaultCacheTrust)
	def(&c.NewcomerHorizon, DefaultNewcomerHorizon)
	def(&c.ClockSyncInterval, DefaultClockSyncInterval)
	def(&c.MinPoll, DefaultMinPoll)
	def(&c.MaxPoll, DefaultMaxPoll)
	if c.MaxWaiters <= 0 {
		c.MaxWaiters = 1000
	}
	if c.MaxLocksPerSession == 0 {
		c.MaxLocksPerSession = DefaultMaxLocksPerSession
	}
	return c
}

// Validate checks the configuration after defaults; the error names the key.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.URI == "":
		return fmt.Errorf("lockstore.uri: required")
	case c.DefaultLease < 0:
		return fmt.Errorf("lockstore.defaultLeaseMS: must be positive")
	case c.MaxLease < 0:
		return fmt.Errorf("lockstore.maxLeaseMS: must be positive")
	case c.DefaultLease > c.MaxLease:
		return fmt.Errorf("lockstore.defaultLeaseMS: %v exceeds maxLeaseMS %v", c.DefaultLease, c.MaxLease)
	case c.CleanupAfter < MinCleanupAfter:
		return fmt.Errorf("lockstore.cleanupAfter: must be at least %v", MinCleanupAfter)
	case c.CleanupAfter < 12*c.OpTimeout:
		return fmt.Errorf("lockstore.cleanupAfter: must be at least 12 x opTimeout (%v)", 12*c.OpTimeout)
	case c.OpTimeout < 0:
		return fmt.Errorf("lockstore.opTimeout: must be positive")
	case c.ClockSyncInterval < 0:
		return fmt.Errorf("lockstore.clockSyncInterval: must be positive")
	case c.MinPoll < 0 || c.MaxPoll < c.MinPoll:
		return fmt.Errorf("lockstore.maxPoll: must be at least minPoll (%v)", c.MinPoll)
	}
	return nil
}
