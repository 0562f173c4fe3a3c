package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// TargetHandoff is DESIGN §7's bound on the p50 handoff to a waiter on
// the same proxy.
const TargetHandoff = 2 * time.Millisecond

// TargetHandoffAcross is issue 14's bound on the p50 handoff to a waiter
// on another proxy without change streams (it learns of the release by
// polling the lock store).
const TargetHandoffAcross = 50 * time.Millisecond

// The lock benchmark's namespace (no policy rule: locks only).
const (
	locksDB   = "bench"
	locksColl = "jobs"
)

// LockConfig says what RunLocks measures. Everything runs through lockgate
// gateways with the Go driver against one embedded FerretDB, which is both
// the upstream and the lock store.
type LockConfig struct {
	// Rounds interleaves the throughput legs, and the handoff setups.
	Rounds int
	// Round is how long each throughput leg runs per round.
	Round  time.Duration
	Warmup time.Duration
	// Clients are the client counts of the uncontended legs (each client
	// its own key).
	Clients []int
	// Contenders share one key in the contended leg.
	Contenders int
	// Handoffs is how many handoffs each setup makes per round.
	Handoffs int
	// HoldMin and HoldMax bound the time a holder keeps the lock after the
	// waiter has started waiting (uniformly random, so that a poller's
	// phase is random too).
	HoldMin, HoldMax time.Duration
	// Poll is the baseline's retry interval (the seed articles: 100 ms).
	Poll time.Duration
	// Wait is the waitMS of waiting acquires; Lease the leaseMS of all.
	Wait, Lease time.Duration
	Progress    io.Writer
}

// DefaultLockConfig is the default run: about a minute.
func DefaultLockConfig() LockConfig {
	return LockConfig{
		Rounds:     5,
		Round:      500 * time.Millisecond,
		Warmup:     200 * time.Millisecond,
		Clients:    []int{1, 8},
		Contenders: 8,
		Handoffs:   8,
		HoldMin:    30 * time.Millisecond,
		HoldMax:    230 * time.Millisecond,
		Poll:       100 * time.Millisecond,
		Wait:       10 * time.Second,
		Lease:      30 * time.Second,
	}
}

// uncontendedLeg and contendedLeg name the throughput legs.
func uncontendedLeg(n int) Leg { return Leg(fmt.Sprintf("uncontended, %d client(s), own keys", n)) }
func contendedLeg(n int) Leg   { return Leg(fmt.Sprintf("contended, %d clients, 1 key, waitMS", n)) }

// HandoffSetup is one way a waiter learns that the lock is free.
type HandoffSetup struct {
	Name   string
	Across bool // holder and waiter on two gateways sharing the lock collection
	Poll   bool // the waiter retries acquireLock waitMS 0 every LockConfig.Poll
}

// HandoffSetups lists the setups in report order.
var HandoffSetups = []HandoffSetup{
	{Name: "one proxy, waitMS"},
	{Name: "two proxies, waitMS", Across: true},
	{Name: "one proxy, retry every 100 ms (baseline)", Poll: true},
	{Name: "two proxies, retry every 100 ms (baseline)", Across: true, Poll: true},
}

// Handoffs are the samples of one setup, in nanoseconds.
type Handoffs struct {
	Setup HandoffSetup
	// FromSent: from just before the holder sends releaseLock to the
	// moment the waiter's acquireLock reply arrives. FromAck: from the
	// moment the holder's releaseLock reply arrives. Release: the
	// holder's releaseLock round trip.
	FromSent, FromAck, Release []int64
	// Attempts is how many acquireLock commands the waiters sent.
	Attempts int64
	// RoundTrips counts both gateways' lock store round trips during the
	// setup's handoffs (releases, acquires, and any polling).
	RoundTrips float64
}

// LockReport is the outcome of RunLocks.
type LockReport struct {
	Config     LockConfig
	Started    time.Time
	Took       time.Duration
	GoVersion  string
	GOMAXPROCS int
	NumCPU     int
	LoadBefore string
	LoadAfter  string
	CPUShare   float64
	// Throughput has a leg per uncontended client count and the contended
	// one; an operation is one acquireLock + releaseLock cycle.
	Throughput *Cell
	Legs       []Leg
	// Acquire and Release are the uncontended legs' latencies of each
	// command alone, by leg (all rounds).
	Acquire, Release map[Leg][]int64
	// RoundTrips is the lock store round trips per leg (timed rounds).
	RoundTrips map[Leg]float64
	Handoffs   []*Handoffs
	// Grants counts the contended leg's grants, all checked for a double
	// grant and for increasing fencing tokens.
	Grants int64
}

// RunLocks measures the lock commands through lockgate: acquire+release
// throughput without and with contention, and the handoff from a releasing
// holder to a waiter, on one proxy and across two, against the baseline of
// a client that retries every 100 ms.
func RunLocks(ctx context.Context, cfg LockConfig) (rep *LockReport, err error) {
	if cfg.Rounds <= 0 || cfg.Round <= 0 || cfg.Handoffs <= 0 || cfg.Contenders <= 0 || len(cfg.Clients) == 0 ||
		cfg.HoldMin <= 0 || cfg.HoldMax < cfg.HoldMin || cfg.Poll <= 0 || cfg.Wait <= 0 {
		return nil, errors.New("bench: locks: Rounds, Round, Handoffs, Contenders, Clients, HoldMin ≤ HoldMax, Poll and Wait must be set")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep = &LockReport{
		Config: cfg, Started: time.Now(), GoVersion: runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(), LoadBefore: loadAvg(),
		Acquire: make(map[Leg][]int64), Release: make(map[Leg][]int64), RoundTrips: make(map[Leg]float64),
	}
	cpu0 := processCPU()

	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	f, err := startFerret()
	if err != nil {
		return nil, err
	}
	closers = append(closers, f.Close)
	// Two gateways on the same deployment share its lock collection.
	var gws [2]*Gateway
	var dbs [2]*mongo.Database
	pool := max(slices.Max(cfg.Clients), cfg.Contenders) + 4
	for i := range gws {
		g, err := StartGateway(f.URI(), "")
		if err != nil {
			return nil, err
		}
		closers = append(closers, g.Close)
		gws[i] = g
		c, err := connectTo(ctx, g.Addr(), Lockgate, locksDB, locksColl, pool)
		if err != nil {
			return nil, err
		}
		closers = append(closers, c.Close)
		if err := c.StartSessions(pool); err != nil {
			return nil, err
		}
		dbs[i] = c.client.Database(locksDB)
		if i == 0 {
			if err := runThroughput(ctx, cfg, g, dbs[0], c.sessions, rep); err != nil {
				return rep, err
			}
		}
	}
	if err := runHandoffs(ctx, cfg, gws, dbs, rep); err != nil {
		return rep, err
	}
	rep.Took = time.Since(rep.Started)
	rep.CPUShare = float64(processCPU()-cpu0) / float64(rep.Took) / float64(rep.NumCPU)
	rep.LoadAfter = loadAvg()
	return rep, nil
}

// runThroughput runs the uncontended and contended legs, interleaved.
func runThroughput(ctx context.Context, cfg LockConfig, gw *Gateway, db *mongo.Database, sessions []mongo.Session, rep *LockReport) error {
	var legs []Leg
	ops := make(map[Leg]func(ctx context.Context, i int, rng *rand.Rand) error)
	clients := make(map[Leg]int)
	var acqMu sync.Mutex
	for _, n := range cfg.Clients {
		l := uncontendedLeg(n)
		legs = append(legs, l)
		clients[l] = n
		last := make([]int64, n)
		ops[l] = func(ctx context.Context, i int, _ *rand.Rand) error {
			key := fmt.Sprintf("own-%d-%d", n, i)
			t0 := time.Now()
			tok, err := acquireLock(ctx, db, sessions[i], locksColl, bson.A{key}, cfg.Lease, 0)
			if err != nil {
				return fmt.Errorf("%s: acquireLock: %w", l, err)
			}
			t1 := time.Now()
			if tok[0] <= last[i] {
				return fmt.Errorf("%s: token %d after %d: fencing tokens must increase", l, tok[0], last[i])
			}
			last[i] = tok[0]
			rel, err := releaseLock(ctx, db, sessions[i], locksColl, bson.A{key})
			if err != nil {
				return fmt.Errorf("%s: releaseLock: %w", l, err)
			}
			if rel != 1 {
				return fmt.Errorf("%s: releaseLock released %d, want 1", l, rel)
			}
			t2 := time.Now()
			acqMu.Lock()
			rep.Acquire[l] = append(rep.Acquire[l], int64(t1.Sub(t0)))
			rep.Release[l] = append(rep.Release[l], int64(t2.Sub(t1)))
			acqMu.Unlock()
			return nil
		}
	}
	{
		n := cfg.Contenders
		l := contendedLeg(n)
		legs = append(legs, l)
		clients[l] = n
		var holder atomic.Int32
		var lastToken int64 // written by the holder only
		key := "hot"
		ops[l] = func(ctx context.Context, i int, _ *rand.Rand) error {
			tok, err := acquireLock(ctx, db, sessions[i], locksColl, bson.A{key}, cfg.Lease, cfg.Wait)
			if err != nil {
				return fmt.Errorf("%s: acquireLock: %w", l, err)
			}
			if !holder.CompareAndSwap(0, int32(i+1)) {
				return fmt.Errorf("%s: client %d was granted the lock that client %d holds", l, i, holder.Load()-1)
			}
			if tok[0] <= lastToken {
				return fmt.Errorf("%s: token %d after %d: fencing tokens must increase", l, tok[0], lastToken)
			}
			lastToken = tok[0]
			atomic.AddInt64(&rep.Grants, 1)
			holder.Store(0)
			rel, err := releaseLock(ctx, db, sessions[i], locksColl, bson.A{key})
			if err != nil {
				return fmt.Errorf("%s: releaseLock: %w", l, err)
			}
			if rel != 1 {
				return fmt.Errorf("%s: releaseLock released %d, want 1", l, rel)
			}
			return nil
		}
	}
	rep.Legs = legs
	maxClients := 0
	for _, n := range clients {
		maxClients = max(maxClients, n)
	}
	rec := NewRecorder(maxClients, 1<<14)
	cell := &Cell{Upstream: FerretDB, Workload: "acquireLock+releaseLock", Rounds: make(map[Leg][]Round)}
	seed := uint64(time.Now().UnixNano())
	err := interleave(cell, legs, cfg.Rounds, cfg.Round, cfg.Warmup, func(l Leg, d time.Duration, warm bool) (Round, error) {
		seed++
		before, err := gw.RoundTrips()
		if err != nil {
			return Round{}, err
		}
		if warm {
			// The warm-up's latencies are not kept.
			acqMu.Lock()
			na, nr := len(rep.Acquire[l]), len(rep.Release[l])
			acqMu.Unlock()
			defer func() {
				acqMu.Lock()
				rep.Acquire[l], rep.Release[l] = rep.Acquire[l][:na], rep.Release[l][:nr]
				acqMu.Unlock()
			}()
		}
		r, err := runLoop(ctx, clients[l], d, 0, rec, seed, processCPU, ops[l])
		after, gerr := gw.RoundTrips()
		if err == nil {
			err = gerr
		}
		if !warm {
			rep.RoundTrips[l] += total(roundTripsDelta(before, after))
		}
		return r, err
	})
	if err != nil {
		return err
	}
	rep.Throughput = cell
	for _, l := range legs {
		s, _ := cell.Median(l)
		fmt.Fprintf(cfg.Progress, "locks %-40s %.0f cycles/s p50 %.2fms p99 %.2fms, %.1f lock store round trips per cycle\n",
			l, s.Throughput, ms(s.P50), ms(s.P99), rep.RoundTrips[l]/float64(max(opsOf(cell, l), 1)))
	}
	return nil
}

func opsOf(c *Cell, l Leg) int64 {
	var n int64
	for _, r := range c.Rounds[l] {
		n += r.Ops
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// party is one side of a handoff: a session through one gateway.
type party struct {
	db      *mongo.Database
	session mongo.Session
}

// runHandoffs measures every setup, interleaved over rounds.
func runHandoffs(ctx context.Context, cfg LockConfig, gws [2]*Gateway, dbs [2]*mongo.Database, rep *LockReport) error {
	type state struct {
		h       *Handoffs
		key     string
		parties [2]party
		holder  int   // index of the party that holds the key
		token   int64 // its token
	}
	var states []*state
	for k, s := range HandoffSetups {
		st := &state{h: &Handoffs{Setup: s}, key: fmt.Sprintf("handoff-%d", k)}
		for j := range st.parties {
			g := 0
			if s.Across && j == 1 {
				g = 1
			}
			sess, err := dbs[g].Client().StartSession()
			if err != nil {
				return err
			}
			defer sess.EndSession(context.Background())
			st.parties[j] = party{db: dbs[g], session: sess}
		}
		tok, err := acquireLock(ctx, st.parties[0].db, st.parties[0].session, locksColl, bson.A{st.key}, cfg.Lease, 0)
		if err != nil {
			return fmt.Errorf("%s: first acquireLock: %w", s.Name, err)
		}
		st.token = tok[0]
		states = append(states, st)
		rep.Handoffs = append(rep.Handoffs, st.h)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	roundTrips := func() (float64, error) {
		var t float64
		for _, g := range gws {
			m, err := g.RoundTrips()
			if err != nil {
				return 0, err
			}
			t += total(m)
		}
		return t, nil
	}
	for r := range cfg.Rounds {
		for j := range states {
			st := states[(r+j)%len(states)]
			before, err := roundTrips()
			if err != nil {
				return err
			}
			for range cfg.Handoffs {
				hold := cfg.HoldMin + time.Duration(rng.Int64N(int64(cfg.HoldMax-cfg.HoldMin)+1))
				res, err := handoff(ctx, cfg, st.parties[st.holder], st.parties[1-st.holder], st.key, st.token, hold, st.h.Setup.Poll)
				if err != nil {
					return fmt.Errorf("handoff, %s: %w", st.h.Setup.Name, err)
				}
				st.h.FromSent = append(st.h.FromSent, int64(res.granted.Sub(res.sent)))
				st.h.FromAck = append(st.h.FromAck, int64(res.granted.Sub(res.acked)))
				st.h.Release = append(st.h.Release, int64(res.acked.Sub(res.sent)))
				st.h.Attempts += res.attempts
				st.holder, st.token = 1-st.holder, res.token
			}
			after, err := roundTrips()
			if err != nil {
				return err
			}
			st.h.RoundTrips += after - before
		}
	}
	for _, st := range states {
		p := st.parties[st.holder]
		if _, err := releaseLock(ctx, p.db, p.session, locksColl, bson.A{st.key}); err != nil {
			return err
		}
		fmt.Fprintln(cfg.Progress, "locks handoff "+st.h.Line())
	}
	return nil
}

type handoffResult struct {
	sent, acked, granted time.Time
	token                int64
	attempts             int64
}

// handoff has the waiter start acquiring the key that the holder holds
// (with heldToken), lets the holder keep it for hold, releases it and
// returns when the waiter holds it.
func handoff(ctx context.Context, cfg LockConfig, holder, waiter party, key string, heldToken int64, hold time.Duration, poll bool) (handoffResult, error) {
	type grant struct {
		at       time.Time
		token    int64
		attempts int64
		err      error
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Wait+hold+10*time.Second)
	defer cancel()
	done := make(chan grant, 1)
	go func() {
		var g grant
		defer func() { done <- g }()
		deadline := time.Now().Add(cfg.Wait)
		for {
			wait := cfg.Wait
			if poll {
				wait = 0
			}
			g.attempts++
			tok, err := acquireLock(ctx, waiter.db, waiter.session, locksColl, bson.A{key}, cfg.Lease, wait)
			g.at = time.Now()
			if err == nil {
				g.token = tok[0]
				return
			}
			if !poll || !isLockBusy(err) || g.at.After(deadline) {
				g.err = err
				return
			}
			select {
			case <-time.After(cfg.Poll):
			case <-ctx.Done():
				g.err = ctx.Err()
				return
			}
		}
	}()
	var res handoffResult
	select {
	case g := <-done:
		return res, fmt.Errorf("the waiter finished before the release (after %d attempts): %v", g.attempts, g.err)
	case <-time.After(hold):
	}
	res.sent = time.Now()
	n, err := releaseLock(ctx, holder.db, holder.session, locksColl, bson.A{key})
	res.acked = time.Now()
	if err != nil {
		cancel()
		<-done
		return res, fmt.Errorf("releaseLock: %w", err)
	}
	g := <-done
	if n != 1 {
		return res, fmt.Errorf("releaseLock released %d, want 1", n)
	}
	if g.err != nil {
		return res, fmt.Errorf("the waiter did not get the lock (after %d attempts): %w", g.attempts, g.err)
	}
	if g.token <= heldToken {
		return res, fmt.Errorf("the waiter's token %d is not above the holder's %d", g.token, heldToken)
	}
	res.granted, res.token, res.attempts = g.at, g.token, g.attempts
	return res, nil
}

// pct returns the p-th percentile of a copy of xs.
func pct(xs []int64, p int) time.Duration { return percentile(slices.Clone(xs), p) }

// Line is a one-line summary.
func (h *Handoffs) Line() string {
	return fmt.Sprintf("%-44s n=%d  sent→granted p50 %.2fms p99 %.2fms  acked→granted p50 %.2fms p99 %.2fms  release p50 %.2fms  %.1f attempts, %.1f lock store round trips per handoff",
		h.Setup.Name, len(h.FromSent), ms(pct(h.FromSent, 50)), ms(pct(h.FromSent, 99)), ms(pct(h.FromAck, 50)), ms(pct(h.FromAck, 99)),
		ms(pct(h.Release, 50)), float64(h.Attempts)/float64(max(len(h.FromSent), 1)), h.RoundTrips/float64(max(len(h.FromSent), 1)))
}

// baseline returns the polling setup with the same topology as s.
func (r *LockReport) baseline(s HandoffSetup) *Handoffs {
	for _, h := range r.Handoffs {
		if h.Setup.Poll && h.Setup.Across == s.Across {
			return h
		}
	}
	return nil
}

// WriteMarkdown writes the report as Markdown tables.
func (r *LockReport) WriteMarkdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Locks run %s, %s, GOMAXPROCS=%d (NumCPU=%d), embedded FerretDB as upstream and lock store, two gateways; throughput %d rounds x %v per leg (%v warm-up), handoffs %d per setup per round x %d rounds, hold %v–%v; took %v. Load average %s before, %s after; this process got %.0f%% of the machine's CPU time.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.GOMAXPROCS, r.NumCPU, cfg.Rounds, cfg.Round, cfg.Warmup,
		cfg.Handoffs, cfg.Rounds, cfg.HoldMin, cfg.HoldMax, r.Took.Round(time.Second), r.LoadBefore, r.LoadAfter, 100*r.CPUShare)

	if c := r.Throughput; c != nil {
		fmt.Fprintln(w, "Throughput: one operation is acquireLock + releaseLock in the client's session (median of the rounds [interquartile range of the rounds' throughput]).")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| leg | cycles/s | cycle p50 ms | cycle p99 ms | acquireLock p50 ms | releaseLock p50 ms | lock store round trips per cycle | CPU ms/cycle |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|")
		for _, l := range r.Legs {
			s, ok := c.Median(l)
			if !ok {
				continue
			}
			var thr []float64
			for _, rd := range c.Rounds[l] {
				thr = append(thr, rd.Throughput())
			}
			q1, q3 := quartiles(thr)
			acq, rel := "", ""
			if xs := r.Acquire[l]; len(xs) > 0 {
				acq = fmt.Sprintf("%.2f", ms(pct(xs, 50)))
				rel = fmt.Sprintf("%.2f", ms(pct(r.Release[l], 50)))
			}
			fmt.Fprintf(w, "| %s | %.0f [%.0f–%.0f] | %.2f | %.2f | %s | %s | %.1f | %.2f |\n",
				l, s.Throughput, q1, q3, ms(s.P50), ms(s.P99), acq, rel,
				r.RoundTrips[l]/float64(max(opsOf(c, l), 1)), ms(s.CPUPerOp))
		}
		fmt.Fprintf(w, "\nContended leg: %d grants, none while another client held the lock, fencing tokens strictly increasing.\n\n", r.Grants)
	}

	if len(r.Handoffs) > 0 {
		fmt.Fprintln(w, "Handoff: the holder releases while the waiter waits (acquireLock with waitMS, or the baseline's acquireLock waitMS 0 retried every 100 ms); \"sent\" is just before the holder sends releaseLock, \"acked\" when its reply arrives, \"granted\" when the waiter's successful acquireLock reply arrives.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| setup | handoffs | sent → granted p50 | p99 | acked → granted p50 | p99 | releaseLock p50 | acquireLock sent per handoff | lock store round trips per handoff | p50 (acked) vs baseline |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
		for _, h := range r.Handoffs {
			vs := ""
			if b := r.baseline(h.Setup); b != nil && b != h {
				vs = fmt.Sprintf("%.3fx", float64(pct(h.FromAck, 50))/float64(max(pct(b.FromAck, 50), 1)))
			}
			p50 := fmt.Sprintf("%.2f ms", ms(pct(h.FromAck, 50)))
			switch {
			case h.Setup.Poll:
			case h.Setup.Across:
				p50 += " " + verdict(pct(h.FromAck, 50) <= TargetHandoffAcross)
			default:
				p50 += " " + verdict(pct(h.FromAck, 50) <= TargetHandoff)
			}
			n := float64(max(len(h.FromSent), 1))
			fmt.Fprintf(w, "| %s | %d | %.2f ms | %.2f ms | %s | %.2f ms | %.2f ms | %.1f | %.1f | %s |\n",
				h.Setup.Name, len(h.FromSent), ms(pct(h.FromSent, 50)), ms(pct(h.FromSent, 99)),
				p50, ms(pct(h.FromAck, 99)), ms(pct(h.Release, 50)),
				float64(h.Attempts)/n, h.RoundTrips/n, vs)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Every handoff checked: the release freed exactly one lock, the waiter was granted it, with a fencing token above the holder's.")
		fmt.Fprintln(w)
	}
}
