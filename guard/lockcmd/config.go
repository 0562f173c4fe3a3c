// Package lockcmd is the guard's stage for the lock commands
// (acquireLock, renewLock, releaseLock, lockStatus): the proxy answers
// them from the lock store and never forwards them, so that behind no
// proxy MongoDB answers CommandNotFound and an application can tell it is
// unprotected. What each command accepts is its entry in the command
// table (wire.RoleLock). The stage is built from explicit dependencies
// (Config), nothing of the guard itself.
package lockcmd

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Store is what the lock commands need of the lock store.
type Store interface {
	Acquire(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error)
	Renew(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error)
	Release(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error)
	ReleaseAll(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, errText string) (int, error)
	Status(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
}

// Collections tells whether a collection exists (the guard's
// MongoResolver does, from its cached listCollections).
type Collections interface {
	CollectionExists(ctx context.Context, ns namespace.Namespace) (bool, error)
}

// CaseTwins finds an existing collection whose name differs from a
// missing one only by case.
type CaseTwins interface {
	CaseTwin(ctx context.Context, ns namespace.Namespace) (string, bool)
}

// Config is what the stage needs from outside.
type Config struct {
	Store Store
	// Owner is the lock owner of req's caller in session, bound to bind
	// (the guard's keyed owner).
	Owner func(req *proxy.Request, session []byte, bind string) lockstore.Owner
	// SessionKey is the owner key of a (user, lsid) session.
	SessionKey func(user string, lsid []byte) []byte
	// Authority answers what the caller may do.
	Authority *authority.Authority
	// Admit waits until the connection may run a lock command on ids ids
	// (the guard's throttle), false when ctx ends first; Done ends it,
	// saying whether the command was malformed.
	Admit func(ctx context.Context, conn *proxy.ClientInfo, ids int) bool
	Done  func(conn *proxy.ClientInfo, malformed bool)
	// Flights waits for a session's writes still in flight on this proxy
	// (inflight.Tracker): a release waits for them.
	Flights interface {
		WaitSession(ctx context.Context, session []byte) error
	}
	// Fence stamps the tokens of locks just acquired in ns into their
	// documents where ns's rule fences them (the guard's fence); a
	// refusal releases them again.
	Fence func(ctx context.Context, ns namespace.Namespace, o lockstore.Owner, locks []lockstore.Lock) *refuse.Error
	// FenceFloors, when set, is the fence stamp each of ids carries in
	// ns where ns's rule fences them (nil where none is known): the
	// acquire's tokens must pass them (lockstore.WithTokenFloors), or a
	// stamp another lock store wrote refuses the new holder's stamp.
	FenceFloors func(ctx context.Context, ns namespace.Namespace, ids []docid.ID) []int64
	// Policy returns the policy in force (refuseLocksOnMissingCollection).
	Policy func() *policy.Policy
	// Collections and Twins, when set, give the hints and the refusal of
	// a lock on a missing collection.
	Collections Collections
	Twins       CaseTwins
	// Observe counts a command's result and time
	// (lockgate_lock_commands_total, lockgate_lock_command_seconds).
	Observe func(command, result string, took time.Duration)
	Log     *zap.Logger
	// MaxWait bounds waitMS, MaxLockIDs the ids of one command,
	// OrderTimeout the waits of releases and renewals for the requests
	// sent before them.
	MaxWait      time.Duration
	MaxLockIDs   int
	OrderTimeout time.Duration
}
