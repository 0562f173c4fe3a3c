package guard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/boundary"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/lockcmd"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/guard/sessions"
	"github.com/lockgate/lockgate/guard/txn"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.uber.org/zap"
)

// LockStore is what the guard needs of the lock store; *lockstore.Store
// implements it.
type LockStore interface {
	Acquire(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error)
	Renew(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error)
	Release(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error)
	ReleaseAll(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, errText string) (int, error)
	ReleaseSession(ctx context.Context, session []byte) (int, error)
	Status(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	Holds(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error)
}

// A capability whose signature drifted from the store's would not fail
// anywhere: its type assertion would quietly turn it off. These make it
// fail to compile instead.
var (
	_ LockStore               = (*lockstore.Store)(nil)
	_ enforce.TokenStore      = (*lockstore.Store)(nil)
	_ enforce.Confirmer       = (*lockstore.Store)(nil)
	_ enforce.LockTeller      = (*lockstore.Store)(nil)
	_ enforce.ElsewhereFinder = (*lockstore.Store)(nil)
	_ enforce.MemoStore       = (*lockstore.Store)(nil)
	_ enforce.TokenIntoStore  = (*lockstore.Store)(nil)
	_ enforce.HeldLister      = (*lockstore.Store)(nil)
	_ txn.Store               = (*lockstore.Store)(nil)
	_ fence.DB                = (*MongoResolver)(nil)
	_ lockcmd.Collections     = (*MongoResolver)(nil)
	_ lockcmd.CaseTwins       = (*MongoResolver)(nil)
)

// Reserved names the lock store's namespaces, which the boundary seals
// (boundary.Reserved); the guard takes them in Options so that one value
// configures the lock store and its seal.
type Reserved = boundary.Reserved

// ReservedFor returns the namespaces of a lock store configured with
// database db and lock collection coll.
func ReservedFor(db, coll string) Reserved { return boundary.ReservedFor(db, coll) }

// DefaultMaxLockIDs bounds the ids of one lock command when Options do
// not: each costs a round trip to the lock store.
const DefaultMaxLockIDs = 1000

// Options configure a Guard.
type Options struct {
	Store LockStore
	// Reserved are the lock store's namespaces, sealed against every
	// client request; zero seals nothing (tests without a lock store).
	Reserved Reserved
	// Resolver finds the documents of writes whose filter does not pin
	// _id; without one such writes are refused on enforced namespaces.
	Resolver Resolver
	// ResolveTimeout bounds one resolution, the wait for a resolver slot
	// included; the query carries it as maxTimeMS. 0 means 2 s.
	ResolveTimeout time.Duration
	// MaxResolves bounds the resolutions running at once across all
	// connections (each connection runs at most one: requests on a
	// connection are decided in order). Waiters queue first in, first
	// out. 0 means 8.
	MaxResolves int
	// MaxWait bounds acquireLock's waitMS; 0 means 5 minutes.
	MaxWait time.Duration
	// MaxLockIDs bounds the ids of one lock command; 0 means
	// DefaultMaxLockIDs.
	MaxLockIDs int
	// AuthRequired reports whether the upstream refuses unauthenticated
	// clients; lock commands from a connection that has not authenticated
	// are then refused, as they would carry no authority. nil: never.
	AuthRequired func() bool
	// OwnerSecret keys the hashes under which lock owners are stored.
	// Every guard sharing a lock store must have the same one; empty means
	// a random secret for this guard alone.
	OwnerSecret []byte
	// OrderTimeout bounds how long releaseLock, renewLock and endSessions
	// wait for the requests sent before them on their connection to be
	// answered; 0 means 30 s.
	OrderTimeout time.Duration
	// MaxMessageSize bounds a rewritten (pinned) message; 0 means
	// MongoDB's 48 MB.
	MaxMessageSize int
	// EndSessionsSupported tells whether the upstream knows endSessions.
	// When it does not, the proxy answers endSessions itself after
	// releasing the sessions' locks; otherwise it forwards it. The first
	// definite answer is kept; nil means supported.
	EndSessionsSupported func(ctx context.Context) (bool, error)
	Logger               *zap.Logger
	Metrics              *Metrics
	// DecisionSink, when set, takes the decision lines (audit.go) that
	// would go through Logger: the same lines, written without zap
	// (LineSink). It must be Logger's own output.
	DecisionSink *LineSink
	// Trail, when set, gets a record of every decision on an audited or
	// enforced namespace (audit.go).
	Trail AuditTrail
	// AuditRequired makes every allowed enforced write wait until its
	// record is durable, as a rule's AuditRequired does for its own.
	AuditRequired bool

	// MaxInFlight bounds how long this proxy keeps renewing the locks of
	// an enforced write that has not been answered; 0 means 10 minutes
	// (the gateway passes lockstore.maxLeaseMS).
	MaxInFlight time.Duration
	// ImplicitLease is the lease of the implicit locks taken for a write
	// that holds none (unlockedWriters), renewed while it is in flight;
	// a proxy that dies meanwhile leaves them to expire with it. 0 means
	// 30 s (the gateway passes lockstore.defaultLeaseMS).
	ImplicitLease time.Duration
}

// Guard is the proxy's Interceptor: it answers the lock commands and
// releases the locks of ended sessions. It is safe for concurrent use.
type Guard struct {
	opts    Options
	log     *zap.Logger
	audit   *zap.Logger // one line per decision on audited and enforced namespaces
	metrics *Metrics

	// lines writes audit's decision lines itself when the sink was
	// given (nil: through audit).
	lines *lineWriter

	// policy is replaced whole on reload; requests read it once each.
	policy atomic.Pointer[policy.Policy]

	// resolveSlots holds one token per resolution allowed to run; a
	// buffered channel queues blocked senders in arrival order.
	resolveSlots chan struct{}
	// throttle slows or refuses a connection's costly requests once it
	// abuses them (throttle.go).
	throttle *throttle
	// slowResolveSlot is the one slot of connections whose resolutions
	// have run out of time.
	slowResolveSlot chan struct{}
	// refused budgets each caller's resolver time on refused writes
	// (refused.go).
	refused *refusedBudget

	owners *enforce.OwnerKeys
	// sessionMemos are the sessions' memos, shared by their connections
	// (sessionmemo.go).
	sessionMemos *sessionTable
	// locks is enforcement's lock check over opts.Store, and targeting
	// finds the documents of a write (package enforce).
	locks     *enforce.Locks
	targeting *enforce.Targets
	// decider turns a verdict into the proxy's action (package enforce),
	// with the audit record, the refusal's disclosure and the launch.
	decider *enforce.Decider[*verdict]
	// checker checks the locks a write needs (package enforce), with the
	// implicit locks, the flight and the fence's share of the check.
	checker *enforce.Checker[*verdict]
	// walk is enforcement's walk over a request's writes (package
	// enforce), with what acts on an allowed write around it.
	walk *enforce.Walk[*verdict]
	// authority answers what a caller may do (package authority).
	authority *authority.Authority

	// flights are the enforced writes forwarded and not yet answered.
	flights *inflight.Tracker
	// verdicts are verdicts no flight or request points into any more,
	// cleared, for the next write on the same processor (newVerdict):
	// one kept per P, not one per connection, so that the next write's
	// verdict is the one the last write on this core used and left in its
	// cache. A connection's own spare (as before) came back after every
	// other connection's write had run, its 19 lines long gone from L1
	// and, with a few hundred connections, from L2 (docs/BENCHMARKS.md,
	// "the ninth box's footprint").
	verdicts sync.Pool
	// msgBufs are the buffers rewritten messages are encoded into, kept
	// per P as the verdicts are (msgBuf).
	msgBufs sync.Pool
	// txns is the transaction check (package txn), built once from the
	// guard's parts (txn.go).
	txns *txn.Check
	// schemes enforce the locking schemes (package scheme), built once
	// from the guard's parts (scheme.go).
	schemes *scheme.Schemes

	// testImplicit, when set (tests only), sees each write's implicit
	// locks being taken (implicit.go).
	testImplicit *implicitTestHooks
	// testCommitChecked, when set (tests only), runs when a commit's
	// locks were checked, before it is launched (txn.Config.Checked).
	testCommitChecked func()

	// boundary is the first stage (package boundary), built once from the
	// guard's options.
	boundary *boundary.Stage
	// lockCommands is the stage of the lock commands (package lockcmd),
	// built once from the guard's options.
	lockCommands *lockcmd.Stage
	// sessions is the stage of endSessions, commit and abort (package
	// sessions), built once from the guard's options.
	sessions *sessions.Stage
	// chain is Stages as one Interceptor.
	chain proxy.Chain

	// auditFields are the field slices of audit lines (audit.go), reused:
	// a line is written for every decision on a protected namespace.
	auditFields sync.Pool
}

// SetPolicy installs a new policy for every request from now on. Requests
// already being decided finish under the policy they started with.
func (g *Guard) SetPolicy(p *policy.Policy) {
	if p != nil {
		g.metrics.knownDecisions(p)
	}
	g.policy.Store(p)
}

// Policy returns the policy in force, nil before the first SetPolicy.
func (g *Guard) Policy() *policy.Policy { return g.policy.Load() }

// New returns a Guard.
func New(opts Options) *Guard {
	if opts.MaxWait <= 0 {
		opts.MaxWait = 5 * time.Minute
	}
	if opts.MaxMessageSize <= 0 {
		opts.MaxMessageSize = wire.DefaultMaxMessageSize
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.MaxLockIDs <= 0 {
		opts.MaxLockIDs = DefaultMaxLockIDs
	}
	if opts.OrderTimeout <= 0 {
		opts.OrderTimeout = 30 * time.Second
	}
	if opts.ResolveTimeout <= 0 {
		opts.ResolveTimeout = 2 * time.Second
	}
	if opts.MaxResolves <= 0 {
		opts.MaxResolves = 8
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 10 * time.Minute
	}
	if opts.ImplicitLease <= 0 {
		opts.ImplicitLease = 30 * time.Second
	}
	g := &Guard{opts: opts, log: opts.Logger.Named("guard"), audit: opts.Logger.Named("audit").WithOptions(zap.WithCaller(false)),
		metrics: opts.Metrics, resolveSlots: make(chan struct{}, opts.MaxResolves), owners: enforce.NewOwnerKeys(opts.OwnerSecret), sessionMemos: newSessionTable(),
		throttle: newThrottle(time.Now), slowResolveSlot: make(chan struct{}, 1), refused: newRefusedBudget(time.Now)}
	g.authority = authority.New(opts.AuthRequired)
	g.locks = enforce.NewLocks(opts.Store)
	g.targeting = enforce.NewTargets(enforce.TargetsConfig{Resolver: opts.Resolver, ResolveTimeout: opts.ResolveTimeout,
		Authority: g.authority, Throttle: throttleHooks{g}, PinnedIDs: pinnedIDs, PinMemos: pinMemos,
		Resolves: g.metrics.resolves, Seconds: g.metrics.resolveSeconds})
	g.flights = inflight.New(inflight.Config{Store: opts.Store, MaxInFlight: opts.MaxInFlight, Log: g.log, Renewals: g.metrics.inFlightRenewals})
	g.txns = g.newTxnCheck()
	g.checker = &enforce.Checker[*verdict]{Locks: g.locks, Skip: g.skipHeldCheck, Defer: (*verdict).deferToImplicit,
		Held: g.holds(), MayDisclose: g.authority.MayDisclose, InsertChecks: g.metrics.insertChecks}
	g.decider = &enforce.Decider[*verdict]{Record: g.recordAt, Shown: g.shownTo, Launch: g.allowed()}
	g.schemes = g.newSchemes()
	g.walk = g.newWalk()
	g.auditFields.New = func() any { f := make([]zap.Field, 0, 16); return &f }
	g.lines = newLineWriter(opts.DecisionSink, g.audit.Name())
	g.boundary = boundary.New(opts.Reserved, g.Policy, g.log, g.metrics.reservedRefusals)
	lc := lockcmd.Config{Store: opts.Store, Owner: g.owner, SessionKey: g.owners.Session, Authority: g.authority,
		Admit: g.throttle.beforeLockCommand, Done: g.throttle.lockCommandDone, Flights: g.flights, Fence: g.fenceAcquired, FenceFloors: g.fenceFloors,
		Policy: g.Policy, Observe: g.metrics.lockCommand, Log: g.log,
		MaxWait: opts.MaxWait, MaxLockIDs: opts.MaxLockIDs, OrderTimeout: opts.OrderTimeout}
	if c, ok := opts.Resolver.(lockcmd.Collections); ok {
		lc.Collections = c
	}
	if c, ok := opts.Resolver.(lockcmd.CaseTwins); ok {
		lc.Twins = c
	}
	g.lockCommands = lockcmd.New(lc)
	g.sessions = sessions.New(sessions.Config{Store: opts.Store, Flights: g.flights, SessionKey: g.owners.Session,
		Admit: g.throttle.beforeLockCommand, EndTransaction: g.txns.End, EndSessionsSupported: opts.EndSessionsSupported,
		Forget: g.sessionMemos.forgetSession, OrderTimeout: opts.OrderTimeout, Log: g.log, Ended: g.metrics.sessionsEnded})
	g.chain = proxy.Chain(g.Stages())
	return g
}

// Intercept implements proxy.Interceptor: the guard's stages (Stages) as
// one chain, for a proxy that needs nothing else on its request path.
func (g *Guard) Intercept(ctx context.Context, req *proxy.Request) proxy.Decision {
	return g.chain.Intercept(ctx, req)
}

// Stages are the guard's stages in the order a proxy must run them
// (docs/ARCHITECTURE.md, "The request path"):
//
//   - boundary (package boundary): the lock store is reachable in no
//     form, and other sessions' ids are not listed, whatever the policy;
//     first, so that no later stage ever sees such a request;
//   - lock commands (package lockcmd): acquireLock, releaseLock, renewLock,
//     lockStatus, answered by the proxy itself;
//   - sessions (package sessions; the transaction check, package txn):
//     endSessions releases the ended sessions' locks, commit and abort
//     decide a transaction's writes;
//   - enforcement (enforce.go): every other request, decided by the
//     policy's rule for each namespace it writes.
func (g *Guard) Stages() []proxy.Stage {
	return []proxy.Stage{g.boundary, g.lockCommands, g.sessions, enforcementStage{g}}
}
