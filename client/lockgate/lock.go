package lockgate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/mongo/driver/session"
)

// Options tune a lock. The zero value (or nil) is usable.
type Options struct {
	// Lease is the lease asked for on acquire and on every renewal
	// (leaseMS). Default 30s; lockgate refuses more than its
	// lockstore.maxLeaseMS.
	Lease time.Duration
	// Wait is how long Acquire lets lockgate wait for locks held by others
	// (waitMS). Default: until ctx's deadline, or 30s without one.
	// TryAcquire never waits.
	Wait time.Duration
	// RenewEvery is the renewal period. Default Lease/3.
	RenewEvery time.Duration
	// Margin: the lock counts as lost this long before its lease ends
	// unless a renewal succeeded, so that work stops before lockgate starts
	// refusing its writes: keep it above the policy's leaseMargin
	// (default 1s), under which lockgate refuses writes. Default Lease/5.
	Margin time.Duration
	// NoRenew turns the background renewal off; Lost then fires when the
	// lease ends (minus Margin) unless Renew is called in time.
	NoRenew bool
	// Attempts bounds how often acquire and release are sent when the
	// failure may be retried (see the package documentation). Default 3.
	// Renewals are bounded by the lease instead.
	Attempts int
	// CommandTimeout bounds one release or renewal round trip. Default 10s
	// (renewals are also bounded by the lease).
	CommandTimeout time.Duration
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Lease <= 0 {
		r.Lease = 30 * time.Second
	}
	if r.RenewEvery <= 0 {
		r.RenewEvery = r.Lease / 3
	}
	if r.Margin <= 0 {
		r.Margin = r.Lease / 5
	}
	if r.Attempts <= 0 {
		r.Attempts = 3
	}
	if r.CommandTimeout <= 0 {
		r.CommandTimeout = 10 * time.Second
	}
	return r
}

// Held is one lock of a Lock, as lockgate granted it.
type Held struct {
	ID bson.RawValue
	// Token is the fencing token: it increases whenever the lock changes
	// hands, so a resource that remembers the highest token it saw can
	// refuse a stale holder.
	Token int64
	// ExpiresAt is the lease end on the lock store's clock, as of the last
	// acquire or renewal.
	ExpiresAt time.Time
	// LastError is what the previous holder recorded when it released the
	// lock after failed work (Release's errText), if anything.
	LastError string
}

// Lock is a set of held document locks. Its methods are safe for
// concurrent use.
type Lock struct {
	db    *mongo.Database
	coll  string
	ids   []any
	opts  Options
	twin  mongo.Session
	endTw func()

	ctx    context.Context // cancelled when the lock ends, for any reason
	cancel context.CancelCauseFunc
	lost   chan struct{}
	stop   chan struct{} // closed by Release
	done   chan struct{} // closed when the renewer has exited

	cmdMu sync.Mutex // serialises commands on twin: a Session is single-threaded

	mu       sync.Mutex
	held     []Held
	tag      string    // holder.tag of the acquire reply
	deadline time.Time // local monotonic lease end (minus nothing)
	err      error     // why Lost fired
	stopOnce sync.Once
	lostOnce sync.Once
	released bool
	relErr   error
	// autoReleased: the renewer released the locks when Acquire's context
	// ended, so Release has nothing left to send.
	autoReleased bool
}

// Acquire takes the locks on ids in coll, all or nothing, in the caller's
// explicit session sess, waiting up to Options.Wait for locks held by
// others (ErrTimeout after that). The Lock is renewed in the background
// until Release, until ctx ends (the locks are then released) or until it
// is lost (Lost). The session must come from coll's client; end it only
// after Release.
func Acquire(ctx context.Context, sess mongo.Session, coll *mongo.Collection, ids []any, opts *Options) (*Lock, error) {
	o := opts.withDefaults()
	wait := o.Wait
	if wait <= 0 {
		wait = 30 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			wait = time.Until(dl)
		}
	}
	return acquire(ctx, sess, coll, ids, o, wait)
}

// TryAcquire is Acquire without waiting: a lock held by another session
// fails at once with ErrBusy.
func TryAcquire(ctx context.Context, sess mongo.Session, coll *mongo.Collection, ids []any, opts *Options) (*Lock, error) {
	return acquire(ctx, sess, coll, ids, opts.withDefaults(), 0)
}

// WithLock acquires the locks (as Acquire), runs fn with a context that
// carries sess (so every operation given that context runs in the locking
// session) and is cancelled if the lock is lost, then always releases the
// locks, recording fn's error as the locks' lastError. It returns fn's
// error, the loss of the lock if that happened while fn ran (the work may
// then not have been exclusive), and a failed release, joined.
func WithLock(ctx context.Context, sess mongo.Session, coll *mongo.Collection, ids []any, opts *Options, fn func(ctx mongo.SessionContext, l *Lock) error) error {
	l, err := Acquire(ctx, sess, coll, ids, opts)
	if err != nil {
		return err
	}
	fnErr := func() error {
		fctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
		defer stop()
		return fn(mongo.NewSessionContext(fctx, sess), l)
	}()
	lostErr := l.Err()
	errText := ""
	if fnErr != nil {
		errText = fnErr.Error()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CommandTimeout)
	defer cancel()
	relErr := l.Release(rctx, errText)
	if lostErr != nil {
		relErr = nil // nothing left to release; the loss says why
	}
	return errors.Join(fnErr, lostErr, relErr)
}

func acquire(ctx context.Context, sess mongo.Session, coll *mongo.Collection, ids []any, o Options, wait time.Duration) (*Lock, error) {
	if sess == nil {
		return nil, fmt.Errorf("%w: a session is required: locks belong to a logical session, so lock and write in one explicit session (client.StartSession)", ErrInvalid)
	}
	if coll == nil || len(ids) == 0 {
		return nil, fmt.Errorf("%w: a collection and at least one _id are required", ErrInvalid)
	}
	twin, endTwin, err := twinOf(sess)
	if err != nil {
		return nil, err
	}
	l := &Lock{
		db: coll.Database(), coll: coll.Name(), ids: ids, opts: o, twin: twin, endTw: endTwin,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	waitEnd := time.Now().Add(wait)
	var reply bson.Raw
	var sent time.Time
	for attempt := 1; ; attempt++ {
		w := max(time.Until(waitEnd), 0)
		if wait == 0 {
			w = 0
		}
		cmd := bson.D{{Key: "acquireLock", Value: l.coll}, {Key: "ids", Value: ids},
			{Key: "leaseMS", Value: o.Lease.Milliseconds()}, {Key: "waitMS", Value: w.Milliseconds()}}
		sent = time.Now()
		reply, err = l.run(ctx, "acquireLock", cmd)
		if err == nil {
			break
		}
		if !retryable(err) || attempt >= o.Attempts || ctx.Err() != nil {
			// An acquire whose reply was lost may have taken the locks:
			// they stay until their lease ends, as they would for a
			// crashed client. Releasing them here could free locks the
			// session already held before this call.
			endTwin()
			return nil, err
		}
		if !sleep(ctx, backoff(attempt)) {
			endTwin()
			return nil, ctx.Err()
		}
	}
	held, tag := parseLocks(reply)
	l.held, l.tag = held, tag
	l.deadline = sent.Add(o.Lease)
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	go l.renew(ctx)
	return l, nil
}

// twinOf starts a session on sess's client that sends sess's logical
// session id (see the package documentation), and a func that ends it
// without returning the borrowed id to the driver's pool.
func twinOf(sess mongo.Session) (mongo.Session, func(), error) {
	xs, ok := sess.(mongo.XSession)
	if !ok || xs.ClientSession() == nil || xs.ClientSession().Server == nil {
		return nil, nil, fmt.Errorf("%w: the session must be one the Go driver started (client.StartSession)", ErrInvalid)
	}
	if xs.ClientSession().TransactionInProgress() {
		return nil, nil, fmt.Errorf("%w: lock commands cannot run inside a transaction: acquire before StartTransaction", ErrInvalid)
	}
	id := xs.ClientSession().SessionID
	twin, err := sess.Client().StartSession(options.Session().SetCausalConsistency(false))
	if err != nil {
		return nil, nil, err
	}
	cs := twin.(mongo.XSession).ClientSession()
	own := cs.Server
	cs.Server = &session.Server{SessionID: id, LastUsed: time.Now()}
	var once sync.Once
	return twin, func() {
		once.Do(func() {
			cs.Server = own
			twin.EndSession(context.Background())
		})
	}, nil
}

// run sends one lock command in the caller's logical session.
func (l *Lock) run(ctx context.Context, name string, cmd bson.D) (bson.Raw, error) {
	l.cmdMu.Lock()
	defer l.cmdMu.Unlock()
	raw, err := l.db.RunCommand(mongo.NewSessionContext(ctx, l.twin), cmd).Raw()
	if err != nil {
		return nil, fromCommand(name, err)
	}
	return raw, nil
}

func parseLocks(reply bson.Raw) ([]Held, string) {
	var held []Held
	arr, _ := reply.Lookup("locks").ArrayOK()
	vals, _ := arr.Values()
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			continue
		}
		h := Held{ID: d.Lookup("_id")}
		h.Token, _ = d.Lookup("token").AsInt64OK()
		if ms, ok := d.Lookup("expiresAt").DateTimeOK(); ok {
			h.ExpiresAt = time.UnixMilli(ms)
		}
		h.LastError, _ = d.Lookup("lastError").StringValueOK()
		held = append(held, h)
	}
	tag, _ := reply.Lookup("holder", "tag").StringValueOK()
	return held, tag
}

// renew keeps the lease alive until Release, ctx's end or a loss.
func (l *Lock) renew(parent context.Context) {
	defer close(l.done)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	next := time.Now().Add(l.opts.RenewEvery)
	var lastErr error
	failures := 0
	for {
		lostAt := l.deadlineLocal().Add(-l.opts.Margin)
		at := next
		if l.opts.NoRenew || lostAt.Before(at) {
			at = lostAt
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			l.ended(parent)
			return
		case <-t.C:
		}
		lostAt = l.deadlineLocal().Add(-l.opts.Margin)
		if !time.Now().Before(lostAt) {
			why := "the lease ended before a renewal succeeded"
			if lastErr != nil {
				why += ": " + lastErr.Error()
			} else if l.opts.NoRenew {
				why = "the lease ended (automatic renewal is off)"
			}
			l.lose(fmt.Errorf("%w: %s", ErrLost, why))
			return
		}
		if l.opts.NoRenew {
			continue // renewed by hand: re-read the deadline
		}
		actx, acancel := context.WithDeadline(ctx, lostAt)
		err := l.renewOnce(actx)
		acancel()
		switch {
		case err == nil:
			next, lastErr, failures = time.Now().Add(l.opts.RenewEvery), nil, 0
		case ctx.Err() != nil:
			l.ended(parent)
			return
		case !retryable(err):
			l.lose(fmt.Errorf("%w: renewal refused: %w", ErrLost, err))
			return
		default:
			failures++
			lastErr = err
			next = time.Now().Add(min(backoff(failures), l.opts.RenewEvery))
		}
	}
}

// renewOnce sends one renewLock and moves the local deadline.
func (l *Lock) renewOnce(ctx context.Context) error {
	cmd := bson.D{{Key: "renewLock", Value: l.coll}, {Key: "ids", Value: l.ids}, {Key: "leaseMS", Value: l.opts.Lease.Milliseconds()}}
	sent := time.Now()
	reply, err := l.run(ctx, "renewLock", cmd)
	if err != nil {
		return err
	}
	held, _ := parseLocks(reply)
	l.mu.Lock()
	if len(held) > 0 {
		l.held = held
	}
	if d := sent.Add(l.opts.Lease); d.After(l.deadline) {
		l.deadline = d
	}
	l.mu.Unlock()
	return nil
}

// Renew renews the lease now. Needed only with Options.NoRenew.
func (l *Lock) Renew(ctx context.Context) error {
	select {
	case <-l.ctx.Done():
		return context.Cause(l.ctx)
	default:
	}
	return l.renewOnce(ctx)
}

func (l *Lock) deadlineLocal() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// ended runs when the renewer stops for its context or for Release. When
// the Acquire context ended first, the locks are released here.
func (l *Lock) ended(parent context.Context) {
	select {
	case <-l.stop:
		return // Release does the rest
	default:
	}
	cause := context.Cause(parent)
	l.lose(fmt.Errorf("%w: the context of Acquire ended (%v); the locks were released", ErrLost, cause))
	rctx, cancel := context.WithTimeout(context.Background(), l.opts.CommandTimeout)
	defer cancel()
	l.releaseCmd(rctx, "")
	l.mu.Lock()
	l.autoReleased = true
	l.mu.Unlock()
}

func (l *Lock) lose(err error) {
	l.lostOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		// Cancel first: whoever wakes on Lost must find Context already
		// ended, or it could start work under a lock that is gone.
		l.cancel(err)
		close(l.lost)
	})
}

// Lost is closed when the lock is lost: a renewal was refused, the lease
// ran out before a renewal succeeded, or Acquire's context ended. It is not
// closed by Release. Err says why.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lock is held and after a plain Release, otherwise
// why it was lost (matching ErrLost).
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context is cancelled when the lock ends: lost (the cause is Err) or
// released. It carries the values of Acquire's context.
func (l *Lock) Context() context.Context { return l.ctx }

// Locks returns the locks held, in lockgate's canonical order.
func (l *Lock) Locks() []Held {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Held(nil), l.held...)
}

// Token is the fencing token of the first (for one id, the only) lock.
func (l *Lock) Token() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) == 0 {
		return 0
	}
	return l.held[0].Token
}

// HolderTag is the holder tag lockgate shows for this session's locks
// (holder.tag in lockStatus and refusals, the admin views, the audit
// trail): what to look for there. It is not the session id.
func (l *Lock) HolderTag() string { return l.tag }

// Release stops the renewal and releases the locks. A non-empty errText is
// kept on each lock as lastError for the next holder (record why the work
// failed); "" clears it. It returns an error matching ErrNotHeld when some
// lock was no longer held (expired, taken over or force-released).
// Calling it again returns the first result.
func (l *Lock) Release(ctx context.Context, errText string) error {
	l.mu.Lock()
	if l.released {
		err := l.relErr
		l.mu.Unlock()
		return err
	}
	l.released = true
	l.mu.Unlock()
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	var err error
	l.mu.Lock()
	auto := l.autoReleased
	l.mu.Unlock()
	if !auto {
		err = l.releaseCmd(ctx, errText)
	}
	l.cancel(errReleased)
	l.endTw()
	l.mu.Lock()
	l.relErr = err
	l.mu.Unlock()
	return err
}

var errReleased = errors.New("lockgate: lock released")

func (l *Lock) releaseCmd(ctx context.Context, errText string) error {
	cmd := bson.D{{Key: "releaseLock", Value: l.coll}, {Key: "ids", Value: l.ids}}
	if errText != "" {
		cmd = append(cmd, bson.E{Key: "error", Value: errText})
	}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, l.opts.CommandTimeout)
		reply, err := l.run(actx, "releaseLock", cmd)
		cancel()
		if err == nil {
			n, _ := reply.Lookup("released").AsInt64OK()
			if want := len(l.Locks()); int(n) < want {
				return fmt.Errorf("%w: released %d of %d locks; the others were no longer held by this session (expired, taken over or force-released)", ErrNotHeld, n, want)
			}
			return nil
		}
		if !retryable(err) || attempt >= l.opts.Attempts || ctx.Err() != nil {
			return err
		}
		if !sleep(ctx, backoff(attempt)) {
			return ctx.Err()
		}
	}
}

// backoff is a capped exponential delay for the n-th retry.
func backoff(n int) time.Duration {
	d := 50 * time.Millisecond << min(n-1, 5)
	return min(d, time.Second)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ClientOptions are client options for uri with the application name set:
// lockgate shows it as the holder of your locks (refusals, lockStatus, the
// admin console), so a name is required.
func ClientOptions(uri, appName string) *options.ClientOptions {
	if appName == "" {
		panic("lockgate.ClientOptions: an application name is required")
	}
	return options.Client().ApplyURI(uri).SetAppName(appName)
}
