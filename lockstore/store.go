package lockstore

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
	"go.mongodb.org/mongo-driver/mongo/writeconcern"
	"go.uber.org/zap"
)

// Owner identifies who holds a lock: the MongoDB logical session id
// (lsid.id, 16 bytes) plus, optionally, a binding that must match as well.
type Owner struct {
	// Session identifies the owning session (required). The store keeps
	// it as given and compares it exactly; lockgate passes a keyed hash of
	// the authenticated user and the lsid, never the lsid itself, so that
	// what the store holds cannot be replayed as a session id.
	Session []byte
	// App is the client's application name, shown to other sessions.
	App string
	// Client is the client's address, kept for operators.
	Client string
	// User is the authenticated user ("user@db"), kept for operators.
	User string
	// Bind is the stricter owner binding of DESIGN §4: when the proxy sets
	// it (e.g. to the client connection id), a lock taken with Bind "x" is
	// owned only by requests that carry the same session and Bind "x". It is
	// compared exactly, so "" only matches "".
	Bind string
	// Implicit, when set, names the command of a writer that holds no lock
	// of its own (a legacy writer) for which the proxy took this lock for
	// the time of one write; "" for a lock taken with acquireLock. It is
	// shown with the holder, never compared.
	Implicit string
}

// Lock is one lock granted or renewed.
type Lock struct {
	ID        docid.ID  // the _id as the caller gave it
	Token     int64     // fencing token, strictly increasing per key across holders
	ExpiresAt time.Time // lease end, in server time
	LastError string    // error text left by a previous holder's release, if any
}

// Status describes one lock record, for lockStatus and the admin view.
type Status struct {
	NS        namespace.Namespace
	ID        docid.ID  // the _id as first locked (List) or as asked (Status)
	Held      bool      // held by someone with an unexpired lease
	HeldByYou bool      // held by the owner passed to Status
	Holder    Holder    // valid when Held
	Since     time.Time // when the current holder acquired it (Held)
	ExpiresAt time.Time // lease end (Held)
	Token     int64     // last token issued for the key; 0 if never locked
	LastError string    // error text of the last release, if any
	UpdatedAt time.Time // last change of the record
	// ForceReleased: nobody holds it because an operator force-released
	// it (at UpdatedAt, for ForceReason), so that the former holder's
	// next write can be told why, as renewLock is.
	ForceReleased bool
	ForceReason   string
}

// ListOptions filter List.
type ListOptions struct {
	NS          namespace.Namespace // only this namespace; "" for all
	IncludeFree bool                // also list records that nobody holds
	Limit       int                 // at most this many; 0 means 1000
}

// Option configures Open.
type Option func(*Store)

// WithLogger sets the logger; the Store logs under Named("lockstore").
func WithLogger(l *zap.Logger) Option { return func(s *Store) { s.log = l } }

// WithMetrics sets the collectors the Store updates.
func WithMetrics(m *Metrics) Option { return func(s *Store) { s.m = m } }

// WithClock replaces the estimate of the server's clock, for tests. The
// Store then takes the Clock's Now as server time and does not sync.
func WithClock(c Clock) Option { return func(s *Store) { s.clock = c } }

// Expiry is a lock whose lease ended without a release, as this store
// found it: when an acquire took it over for a new owner, or, for a lock
// granted or last renewed through this store, when its scan found the
// lease over and the lock neither released, renewed nor taken over
// (Scanned; expiryscan.go). Its holder's late release of it is a
// release.
type Expiry struct {
	NS namespace.Namespace
	ID docid.ID
	// Former is the holder whose lease ended (its token, lease end, app,
	// user, client and tag).
	Former Holder
	// Token is the new owner's fencing token; At the takeover's time (the
	// store's estimate of server time). A scanned expiry has no new owner
	// (Token 0) and At is the lease's end.
	Token int64
	At    time.Time
	// Scanned: found by the expiry scan, not at a takeover.
	Scanned bool
}

// WithExpiryHook makes the store call fn, on the acquiring goroutine,
// after each takeover of a lock whose lease had ended, and on its
// background goroutine for each lease granted or renewed through it that
// ended without a release and was not taken over (the audit trail
// records them); a generation reported by the scan is not reported again
// at its takeover. fn must return quickly and must not call the store.
func WithExpiryHook(fn func(Expiry)) Option { return func(s *Store) { s.onExpire = fn } }

// Store keeps lock records in a MongoDB collection shared by every proxy
// instance. It is safe for concurrent use by any number of goroutines.
//
// Fail-closed contract: every method that answers "may this owner write"
// (Holds) or "is this granted" (Acquire, Renew) returns an error instead of
// a positive answer when the store cannot be reached or the server time
// estimate is not available; errors.Is(err, ErrUnavailable) then holds.
type Store struct {
	cfg    Config
	client *mongo.Client
	coll   *mongo.Collection // head documents
	claims *mongo.Collection // claims: Collection + "_claims"
	txns   *mongo.Collection // transaction records: Collection + "_txns" (txn.go)
	// instances: every Store's heartbeat, Collection + "_instances"
	// (instances.go).
	instances *mongo.Collection
	log       *zap.Logger
	m         *Metrics
	clock     Clock
	sclock    *serverClock // nil when the clock was injected

	cache *holdCache
	// epoch is the origin of the monotonic times in this Store's held
	// memos (HeldMemo.Fill): a reading of time.Now, made once.
	epoch   time.Time
	via     string // this Store's name in the generations it writes
	owned   *ownedIndex
	sweeper *sessionSweeper
	scans   scanTurns // release-all's queries (scanturns.go)
	// onExpire hears of every lock this store took over after its lease
	// ended without a release (WithExpiryHook); nil: nobody listens.
	onExpire func(Expiry)
	expScan  expiryScan
	wq       *waitQueues
	heldNS   heldNamespaces
	reg      instanceRegistry
	// mem are the implicit locks held in memory and the acquires in
	// flight; gview what they are decided on (memlock.go).
	mem   memLocks
	gview grantView
	// txnSlots guesses where a transaction's next record goes (txn.go).
	txnSlots txnSlots

	setupMu   sync.Mutex
	setupDone atomic.Bool

	// wake, when Config.WakeListen is set, sends and takes wake-up
	// datagrams to and from other Stores (wake.go).
	wake atomic.Pointer[waker]

	streamActive atomic.Bool
	openStream   func(ctx context.Context) (changeStream, error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	// ownsClient: Open connected client, so Close disconnects it; a
	// client given with WithClient belongs to the caller.
	ownsClient bool

	// testHookTry, when set, sees every key in the order an acquire tries it.
	testHookTry func(rid string)
	// testHookHandoff, when set, runs after a release took a waiter for
	// a handoff and before it writes anything.
	testHookHandoff func(rid string)
	// testHookWrote, when set, sees every claim that landed ("claim")
	// and head document written ("head"); an error it returns is
	// reported as that write's, the write having happened: a reply lost
	// or late after the server applied it.
	testHookWrote func(what string, g *gen) error
	// testHookHead, when set, runs after a generation's claim was
	// inserted and before its head document is written.
	testHookHead func(g *gen)
	// testHookClaim, when set, runs before every read of one claim.
	testHookClaim func(rid string, seq int64)
}

// Open connects to the lock store. It fails only for an invalid
// configuration: an unreachable deployment is reported by the operations
// (ErrUnavailable) and by Ping, and the Store keeps trying to reach it in
// the background, so that a proxy can start before its database.
func Open(ctx context.Context, cfg Config, opts ...Option) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Store{cfg: cfg, epoch: time.Now()}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.log = s.log.Named("lockstore")
	if s.m == nil {
		s.m = NewMetrics()
	}
	if s.clock == nil {
		s.sclock = newServerClock(nil) // time.Now, read on the monotonic clock alone where it can be
		s.clock = s.sclock
	}
	if hook := s.onExpire; hook != nil {
		s.onExpire = func(e Expiry) {
			if !e.Scanned && s.expScan.reported(expiryKey(e.NS, e.ID), e.Former.Token) {
				return // the scan reported this lease's end already
			}
			hook(e)
		}
	}
	s.cache = newHoldCache(s.m.held)
	var via [8]byte
	_, _ = crand.Read(via[:])
	s.via = hex.EncodeToString(via[:])
	s.wq = newWaitQueues()
	s.owned = newOwnedIndex()
	s.sweeper = newSessionSweeper()
	s.heldNS.trust = cfg.CacheTrust

	copts := options.Client().ApplyURI(cfg.URI).SetAppName(cfg.AppName)
	// Timeouts the URI names are the operator's; otherwise a round trip's.
	if copts.ServerSelectionTimeout == nil {
		copts.SetServerSelectionTimeout(cfg.OpTimeout)
	}
	if copts.ConnectTimeout == nil {
		copts.SetConnectTimeout(cfg.OpTimeout)
	}
	if cfg.MaxPoolSize > 0 {
		copts.SetMaxPoolSize(cfg.MaxPoolSize)
	}
	if s.client == nil {
		client, err := mongo.Connect(ctx, copts)
		if err != nil {
			return nil, fmt.Errorf("lockstore.uri: %w", err)
		}
		s.client, s.ownsClient = client, true
	}
	client := s.client
	// Lock records must survive a failover: majority writes and primary
	// reads, so that a new primary knows every grant that was acknowledged.
	copt := options.Collection().
		SetWriteConcern(&writeconcern.WriteConcern{W: "majority", WTimeout: cfg.OpTimeout}).
		SetReadPreference(readpref.Primary())
	s.coll = client.Database(cfg.Database).Collection(cfg.Collection, copt)
	s.claims = client.Database(cfg.Database).Collection(cfg.Collection+ClaimsSuffix, copt)
	s.txns = client.Database(cfg.Database).Collection(cfg.Collection+TxnsSuffix, copt)
	s.instances = client.Database(cfg.Database).Collection(cfg.Collection+InstancesSuffix, copt)
	s.openStream = s.watchCollection

	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.setup(ctx); err != nil {
		s.log.Warn("lock store not reachable yet; will retry", zap.Error(err))
	}
	s.wg.Add(2)
	go s.background(s.cfg)
	go s.sweepSessions()
	return s, nil
}

// Close stops the background work, makes pending waits return ErrClosed
// and disconnects. Locks stay in the store until released or expired.
func (s *Store) Close(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	if s.setupDone.Load() {
		s.deregister(ctx)
	}
	if !s.ownsClient {
		return nil
	}
	return s.client.Disconnect(ctx)
}

// Ping checks that the store answers (and refreshes the clock estimate).
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if _, err := s.hello(ctx); err != nil {
		return err
	}
	return s.setup(ctx)
}

// helloReply is what the Store needs from hello.
type helloReply struct {
	LocalTime time.Time `bson:"localTime"`
	SetName   string    `bson:"setName"`
	Msg       string    `bson:"msg"`
}

// changeStreamCandidate tells whether a deployment may offer change
// streams: replica sets (setName) and sharded clusters (mongos answers
// msg "isdbgrid"). A standalone server (and FerretDB) does not.
func changeStreamCandidate(h helloReply) bool {
	return h.SetName != "" || h.Msg == "isdbgrid"
}

// hello runs one hello and, with the server clock, records a sample.
func (s *Store) hello(ctx context.Context) (helloReply, error) {
	var h helloReply
	err := s.rt(ctx, opHello, func(ctx context.Context) error {
		sent := time.Now()
		raw, err := s.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
		if err != nil {
			var ce mongo.CommandError
			if errors.As(err, &ce) && ce.Code == int32(mongoerr.CommandNotFound) { // before 4.4.2
				raw, err = s.client.Database("admin").RunCommand(ctx, bson.D{{Key: "isMaster", Value: 1}}).Raw()
			}
			if err != nil {
				return err
			}
		}
		recv := time.Now()
		if err := bson.Unmarshal(raw, &h); err != nil {
			return err
		}
		if s.sclock != nil {
			server := h.LocalTime
			if server.IsZero() {
				// No server clock: fall back to the local one and let the
				// uncertainty say so.
				server = recv
				recv = recv.Add(2 * noServerClockSkew)
			}
			s.sclock.add(clockSample{sent: sent, recv: recv, server: server})
		}
		return nil
	})
	return h, s.storeErr(ctx, opHello, err)
}

// noServerClockSkew is the skew assumed between proxies when the server does
// not report its time (hello without localTime).
const noServerClockSkew = time.Second

// setup measures the clock (if needed) and ensures indexes, once.
func (s *Store) setup(ctx context.Context) error {
	if s.setupDone.Load() {
		return nil
	}
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.setupDone.Load() {
		return nil
	}
	h, err := s.hello(ctx)
	if err != nil {
		return err
	}
	if err := s.ensureIndexes(ctx); err != nil {
		return err
	}
	if changeStreamCandidate(h) {
		s.startWatcher()
	}
	if err := s.heartbeat(ctx, true); err != nil {
		// Grants retry it (mayGrant); until it succeeds none is made.
		s.log.Warn("announcing this instance in the lock store failed; no lock is granted until it succeeds", zap.Error(err))
	} else if s.grantWait() <= maxStartWait {
		// Beside other instances the first grant waits about CacheTrust:
		// done here, at start, where it delays no client's acquire (grants
		// still wait for it if this is cut short, or longer than
		// maxStartWait, as only tests make it).
		if err := s.mayGrant(ctx); err != nil {
			s.log.Debug("waiting to grant at start cut short", zap.Error(err))
		}
	}
	if s.cfg.WakeListen != "" && s.wake.Load() == nil {
		s.startWaker(s.client.Database(s.cfg.Database).Collection(s.cfg.Collection + WakeSuffix))
	}
	s.setupDone.Store(true)
	// The views memory locks and the insert check are decided on, read
	// now rather than at the first tick.
	s.scanClaims(ctx)
	s.refreshHeldNamespaces(ctx)
	return nil
}

// ready makes sure the store was reached once and the server time is known.
func (s *Store) ready(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.setup(ctx)
}

// ClaimsSuffix names the claims collection next to Config.Collection.
const ClaimsSuffix = "_claims"

func (s *Store) ensureIndexes(ctx context.Context) error {
	create := func(c *mongo.Collection, m mongo.IndexModel) error {
		return s.rt(ctx, opIndex, func(ctx context.Context) error {
			_, err := c.Indexes().CreateOne(ctx, m)
			return err
		})
	}
	for _, ci := range []struct {
		c *mongo.Collection
		m mongo.IndexModel
	}{
		{s.coll, mongo.IndexModel{Keys: bson.D{{Key: "owner", Value: 1}, {Key: "ns", Value: 1}}}},
		{s.coll, mongo.IndexModel{Keys: bson.D{{Key: "expiresAt", Value: 1}}}},
		{s.txns, mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}}}},
	} {
		if err := create(ci.c, ci.m); err != nil {
			if isUnreachable(err) {
				return s.storeErr(ctx, opIndex, err)
			}
			s.log.Warn("creating lock index failed; continuing without it", zap.Error(err))
		}
	}
	return s.ensureClaimsIndex(ctx)
}

// isUnreachable tells a failure to talk to the server from a server's
// refusal (which has a code).
func isUnreachable(err error) bool {
	var se mongo.ServerError
	return !errors.As(err, &se)
}

// background refreshes the clock, retries setup, deletes idle records and
// prunes the cache until Close.
// background runs the store's periodic work. It takes the configuration as
// an argument so that it never reads s.cfg concurrently with the caller.
func (s *Store) background(cfg Config) {
	defer s.wg.Done()
	syncT := time.NewTicker(cfg.ClockSyncInterval)
	defer syncT.Stop()
	pruneT := time.NewTicker(time.Second)
	defer pruneT.Stop()
	// Locks held through this Store are re-read together, in one round
	// trip, twice per CacheTrust, so that Holds answers writes from memory
	// instead of reading each key once its verification grows old.
	var refreshC <-chan time.Time
	if cfg.CacheTrust > 0 {
		t := time.NewTicker(max(cfg.CacheTrust/2, 50*time.Millisecond))
		defer t.Stop()
		refreshC = t.C
	}
	var cleanC <-chan time.Time
	if cfg.CleanupInterval > 0 {
		t := time.NewTicker(cfg.CleanupInterval)
		defer t.Stop()
		cleanC = t.C
	}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-syncT.C:
			if !s.setupDone.Load() {
				if err := s.setup(s.ctx); err != nil {
					s.log.Debug("lock store still unreachable", zap.Error(err))
				}
			} else if s.sclock != nil {
				if _, err := s.hello(s.ctx); err != nil {
					s.log.Debug("clock sync failed", zap.Error(err))
				}
			}
		case <-refreshC:
			s.refreshCache(s.ctx)
			if s.setupDone.Load() {
				if err := s.heartbeat(s.ctx, false); err != nil {
					s.log.Debug("heartbeat failed", zap.Error(err))
				}
				s.scanClaims(s.ctx)
			}
			s.refreshHeldNamespaces(s.ctx)
		case <-pruneT.C:
			now, unc := s.clock.Now()
			ended := s.cache.prune(now.Add(-unc), time.Minute)
			s.owned.prune(now.Add(-unc))
			if s.onExpire != nil && s.setupDone.Load() {
				s.expScan.add(ownGens(ended, s.via))
				s.scanExpiries(s.ctx, now.Add(-unc))
			}
		case <-cleanC:
			if n, err := s.Cleanup(s.ctx); err != nil {
				s.log.Debug("cleanup failed", zap.Error(err))
			} else if n > 0 {
				s.log.Info("deleted idle lock records", zap.Int("count", n))
			}
			if n, err := s.cleanupTxns(s.ctx); err != nil {
				s.log.Debug("deleting old transaction records failed", zap.Error(err))
			} else if n > 0 {
				s.log.Info("deleted transaction records past their retention", zap.Int("count", n))
			}
			if n, err := s.CollectHeads(s.ctx); err != nil {
				s.log.Debug("collecting idle lock keys failed", zap.Error(err))
			} else if n > 0 {
				s.log.Info("deleted idle lock keys", zap.Int("count", n))
			}
		}
	}
}

// rt runs one round trip bounded by OpTimeout and records it.
func (s *Store) rt(ctx context.Context, op string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	var rec error
	if err != nil && !mongo.IsDuplicateKeyError(err) && !errors.Is(err, mongo.ErrNoDocuments) {
		rec = err
	}
	s.m.roundTrip(op, start, rec)
	return err
}

// storeErr maps a driver error: nil and "no documents" pass, a cancelled
// caller context is reported as such, anything else is ErrUnavailable.
func (s *Store) storeErr(ctx context.Context, op string, err error) error {
	if err == nil || errors.Is(err, mongo.ErrNoDocuments) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("lockstore %s: %w", op, ctx.Err())
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		// The driver's read ran into the caller's deadline a moment before
		// the context itself reported it (its timer had not fired yet).
		return fmt.Errorf("lockstore %s: %w", op, context.DeadlineExceeded)
	}
	return unavailable(op, err)
}

// gen is one generation of the state of a lock key. It is stored twice:
//
//   - as a claim in the claims collection, _id = genID(key, seq), inserted
//     once and never changed:
//     the unique _id index makes "insert claim seq+1" an atomic
//     compare-and-swap on every MongoDB-compatible server, including
//     FerretDB, whose conditional updates are not atomic;
//   - as the key's head document in the lock collection, _id = key,
//     head = true, replaced after
//     every successful claim: the one fast (by _id) place to read a key's
//     state. It may lag behind the newest claim for a moment (or until the
//     next change, if its writer failed); writers detect that through the
//     duplicate claim and roll forward.
//
// Claims are compacted after Config.CleanupAfter; head documents are never
// deleted, so a key's token can never go back. See docs/LOCKS.md.
type gen struct {
	ID          string            `bson:"_id"`
	Head        bool              `bson:"head,omitempty"`
	Key         string            `bson:"key"`
	Seq         int64             `bson:"seq"`
	NS          string            `bson:"ns"`
	Value       bson.RawValue     `bson:"id,omitempty"`
	Kind        string            `bson:"kind"`
	Owner       *primitive.Binary `bson:"owner"`
	Bind        string            `bson:"bind"`
	OwnerApp    string            `bson:"ownerApp"`
	OwnerClient string            `bson:"ownerClient"`
	OwnerUser   string            `bson:"ownerUser,omitempty"`
	// Implicit is Owner.Implicit: the command of a legacy write the lock
	// was taken for by the proxy.
	Implicit   string    `bson:"implicit,omitempty"`
	Token      int64     `bson:"token"`
	AcquiredAt time.Time `bson:"acquiredAt"`
	ExpiresAt  time.Time `bson:"expiresAt"`
	At         time.Time `bson:"at"`
	LastError  string    `bson:"lastError"`
	Reason     string    `bson:"reason,omitempty"`
	// Via names the Store (the lockgate instance) that wrote this
	// generation: only that Store may answer "held" for it from memory.
	Via string `bson:"via,omitempty"`
	// Shared says that the hold this generation continues was changed
	// through more than one Store, so another Store may still answer
	// "held" from an older generation of it (see quiesce).
	Shared bool `bson:"shared,omitempty"`
}

// Generation kinds, for operators reading the collection.
const (
	kindAcquire = "acquire"
	kindRenew   = "renew"
	kindRelease = "release"
	kindForce   = "force-release"
	// kindHandoff frees the key from one owner and grants it to a waiter
	// in one generation (handoff.go).
	kindHandoff = "handoff"
)

// genID is the _id of generation seq of record id rid. The fixed-width
// suffix makes the mapping injective.
func genID(rid string, seq int64) string { return fmt.Sprintf("%s#%016x", rid, uint64(seq)) }

// keyOfGenID strips the generation suffix.
func keyOfGenID(id string) string {
	if len(id) < 17 || id[len(id)-17] != '#' {
		return ""
	}
	return id[:len(id)-17]
}

func (g *gen) ownedBy(o Owner) bool {
	return g.Owner != nil && string(g.Owner.Data) == string(o.Session) && g.Bind == o.Bind
}

func (g *gen) holder() Holder {
	h := Holder{App: g.OwnerApp, Client: g.OwnerClient, User: g.OwnerUser, ExpiresAt: g.ExpiresAt, Token: g.Token, Implicit: g.Implicit}
	if g.Owner != nil {
		h.SessionPrefix = SessionPrefix(g.Owner.Data)
	}
	return h
}

// lockedID is the _id the record was first locked as. A record whose id
// is not a valid _id (written by hand, or damaged) gives the zero ID,
// which names no document and prints as <invalid>.
func (g *gen) lockedID() docid.ID {
	id, err := docid.New(g.Value)
	if err != nil {
		return docid.ID{}
	}
	return id
}

// heldAt tells whether someone holds the key at server time t.
func (g *gen) heldAt(t time.Time) bool { return g.Owner != nil && g.ExpiresAt.After(t) }

// next returns a copy of g as the claim of generation seq+1 at time now.
func (g *gen) next(kind string, now time.Time) *gen {
	n := *g
	n.Seq = g.Seq + 1
	n.ID, n.Head = genID(g.Key, n.Seq), false
	n.Kind, n.At, n.Reason = kind, now, ""
	return &n
}

// asHead returns the head document of claim g.
func (g *gen) asHead() *gen {
	h := *g
	h.ID, h.Head = g.Key, true
	return &h
}

// freeExpiry is the expiresAt of a released key: far in the past, so that
// every instance sees it free whatever its clock uncertainty.
var freeExpiry = time.Unix(0, 0).UTC()

func sessionBinary(session []byte) *primitive.Binary {
	return &primitive.Binary{Subtype: 0x04, Data: session}
}

// refreshCache confirms every cached lock that names a holder and that
// this Store wrote by reading its head document (one round trip per 1000
// keys, one lookup by _id for a single key): a lock whose head is still
// the cached generation is confirmed as of the moment the read was sent;
// any other is replaced by what was read, unconfirmed, so that Holds reads
// it again. A head can lag behind its claims, or be moved back by the
// late head write of an older generation; heads reads the claim after
// every head that names a holder (newest), so neither is confirmed. Only
// entries verified lately are confirmed this way, like the views writers
// build on (guess).
func (s *Store) refreshCache(ctx context.Context) {
	seen := s.cache.ownHeld(s.via, time.Now().Add(-min(s.cfg.CleanupAfter/8, 30*time.Second)))
	if len(seen) == 0 || !s.setupDone.Load() {
		return
	}
	rids := make([]string, 0, len(seen))
	for rid := range seen {
		rids = append(rids, rid)
	}
	for len(rids) > 0 {
		batch := rids[:min(len(rids), 1000)]
		rids = rids[len(batch):]
		sent := time.Now()
		hs, err := s.heads(ctx, batch)
		if err != nil {
			s.log.Debug("lock cache refresh failed; entries age out", zap.Error(err))
			return
		}
		for _, rid := range batch {
			if h := hs[rid]; h != nil && h.Seq == seen[rid].Seq && h.Token == seen[rid].Token {
				s.cache.confirm(rid, seen[rid], sent)
			} else {
				s.cache.refresh(rid, seen[rid], h, sent)
			}
		}
	}
}
