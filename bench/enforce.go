package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// The legs of the enforcement benchmark. All three send the same
// updateOne({_id}, {$inc: {n: 1}}) in an explicit session per client.
const (
	// Unprotected: through lockgate (the full gateway) to a collection no
	// policy rule protects.
	Unprotected Leg = "unprotected"
	// Enforced: through the same gateway to a collection in enforce mode,
	// each client holding the lock on its own documents, taken through
	// the same gateway in the client's session before the cell.
	Enforced Leg = "enforced"
)

// EnforceLegs lists the legs of the enforcement benchmark (Direct goes to
// the unprotected collection).
var EnforceLegs = []Leg{Direct, Unprotected, Enforced}

// The namespaces of the enforcement benchmark.
const (
	enforceDB   = "bench"
	lockedColl  = "locked" // bench.locked: enforce
	openColl    = "open"   // bench.open: no rule (off)
	LockedNS    = enforceDB + "." + lockedColl
	TargetGuard = 0.95 // an enforced write keeps ≥ 95% of an unprotected one's throughput
)

// EnforceConfig says what RunEnforce measures.
type EnforceConfig struct {
	Upstreams []Upstream
	Clients   []int // 1 and 16 in the targets
	Rounds    int
	Round     time.Duration
	Warmup    time.Duration
	// Docs is how many documents each collection has; client i of n
	// locks and writes the ones whose number ≡ i (mod n). Every one of
	// them is a lock key, re-read from the lock store at most once per
	// second (the lock store's cache trust) while it is written.
	Docs int
	// ProxyBinary, when set, is a lockgate build that the family runs in
	// a process of its own, as a sidecar runs beside its application;
	// empty, lockgate runs in the benchmark's process (StartGateway).
	ProxyBinary string
	Progress    io.Writer
}

// DefaultEnforceConfig is the default run: about a minute on a 2-core
// machine.
func DefaultEnforceConfig() EnforceConfig {
	return EnforceConfig{
		Upstreams: AllUpstreams,
		Clients:   []int{1, 16},
		Rounds:    7,
		Round:     300 * time.Millisecond,
		Warmup:    150 * time.Millisecond,
		Docs:      64,
	}
}

// EnforceCell is one (upstream, clients) cell of the enforcement benchmark.
type EnforceCell struct {
	*Cell
	// RoundTrips counts the lock store round trips of the gateway during
	// the timed rounds of each leg, by operation.
	RoundTrips map[Leg]map[string]float64
}

// Writes is how many updates leg l made in the timed rounds.
func (c *EnforceCell) Writes(l Leg) int64 {
	var n int64
	for _, r := range c.Rounds[l] {
		n += r.Ops
	}
	return n
}

// RoundTripsPerWrite is leg l's lock store round trips per write.
func (c *EnforceCell) RoundTripsPerWrite(l Leg) float64 {
	return total(c.RoundTrips[l]) / float64(max(c.Writes(l), 1))
}

// EnforceReport is the outcome of RunEnforce.
type EnforceReport struct {
	Config     EnforceConfig
	Started    time.Time
	Took       time.Duration
	GoVersion  string
	GOMAXPROCS int
	NumCPU     int
	LoadBefore string // /proc/loadavg
	LoadAfter  string
	CPUShare   float64 // process CPU time over wall time x cores
	Cells      []*EnforceCell
	// Checked says, per upstream, what was verified about the run.
	Checked map[Upstream]string
}

// RunEnforce measures the cost of enforcement: the same _id-pinned update
// directly, through lockgate on an unprotected collection, and through the
// same lockgate on an enforced collection under locks the writing sessions
// hold, interleaved.
func RunEnforce(ctx context.Context, cfg EnforceConfig) (*EnforceReport, error) {
	if cfg.Rounds <= 0 || cfg.Round <= 0 || cfg.Docs <= 0 || len(cfg.Clients) == 0 {
		return nil, errors.New("bench: enforce: Rounds, Round, Docs and Clients must be set")
	}
	for _, u := range cfg.Upstreams {
		if !slices.Contains(AllUpstreams, u) {
			return nil, fmt.Errorf("bench: unknown upstream %q (want one of %v)", u, AllUpstreams)
		}
	}
	if slices.Max(cfg.Clients) > cfg.Docs {
		return nil, fmt.Errorf("bench: %d documents cannot be shared by %d clients", cfg.Docs, slices.Max(cfg.Clients))
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep := &EnforceReport{
		Config: cfg, Started: time.Now(), GoVersion: runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
		LoadBefore: loadAvg(), Checked: make(map[Upstream]string),
	}
	cpu0 := processCPU()
	for _, u := range cfg.Upstreams {
		if err := runEnforceUpstream(ctx, cfg, u, rep); err != nil {
			return rep, fmt.Errorf("enforce %s: %w", u, err)
		}
	}
	rep.Took = time.Since(rep.Started)
	rep.CPUShare = float64(processCPU()-cpu0) / float64(rep.Took) / float64(rep.NumCPU)
	rep.LoadAfter = loadAvg()
	return rep, nil
}

func runEnforceUpstream(ctx context.Context, cfg EnforceConfig, u Upstream, rep *EnforceReport) (err error) {
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	var upAddr, lockURI, storeNote string
	switch u {
	case InstantUpstream:
		in, err := StartInstant(cfg.Docs, payload)
		if err != nil {
			return err
		}
		closers = append(closers, in.Close)
		upAddr = in.Addr()
		// The instant upstream cannot keep lock records: the lock store
		// is an embedded FerretDB of its own.
		f, err := startFerret()
		if err != nil {
			return err
		}
		closers = append(closers, f.Close)
		lockURI = f.URI()
		storeNote = "lock store on a separate embedded FerretDB"
	case FerretDB:
		f, err := startFerret()
		if err != nil {
			return err
		}
		closers = append(closers, f.Close)
		upAddr = f.Addr()
		storeNote = "lock store on the same FerretDB (lockstore.uri empty)"
	}
	var gw gatewayUnderTest
	if cfg.ProxyBinary != "" {
		gw, err = startProcGateway(cfg.ProxyBinary, "mongodb://"+upAddr+"/", lockURI, LockedNS)
	} else {
		gw, err = StartGateway("mongodb://"+upAddr+"/", lockURI, LockedNS)
	}
	if err != nil {
		return err
	}
	closers = append(closers, gw.Close)

	maxClients := slices.Max(cfg.Clients)
	clients := make(map[Leg]*Client, len(EnforceLegs))
	for _, l := range EnforceLegs {
		addr, coll := gw.Addr(), openColl
		switch l {
		case Direct:
			addr = upAddr
		case Enforced:
			coll = lockedColl
		}
		c, err := connectTo(ctx, addr, l, enforceDB, coll, maxClients)
		if err != nil {
			return err
		}
		closers = append(closers, c.Close)
		c.cpu = cpuClock(gw)
		clients[l] = c
		if err := c.StartSessions(maxClients); err != nil {
			return err
		}
	}
	// Both collections are seeded directly: lockgate refuses a drop of an
	// enforced collection.
	direct := clients[Direct]
	directLocked := &Client{Leg: Direct, client: direct.client, coll: direct.client.Database(enforceDB).Collection(lockedColl)}
	for _, c := range []*Client{direct, directLocked} {
		if err := c.Seed(ctx, cfg.Docs); err != nil {
			return err
		}
	}
	enf := clients[Enforced]
	db := enf.client.Database(enforceDB)

	// Enforcement must be on: a write without the lock is refused.
	_, werr := enf.coll.UpdateOne(mongo.NewSessionContext(ctx, enf.sessions[0]), bson.D{{Key: "_id", Value: docID(0)}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int32(1)}}}})
	if !isLockBusy(werr) {
		return fmt.Errorf("an update of %s without the lock was not refused with LockBusy: %v", LockedNS, werr)
	}

	rec := NewRecorder(maxClients, 1<<16)
	updates := make(map[Leg]int64)
	seed := uint64(time.Now().UnixNano())
	for _, n := range cfg.Clients {
		if err := lockShares(ctx, db, enf.sessions, n, cfg.Docs); err != nil {
			return err
		}
		cell := &EnforceCell{
			Cell:       &Cell{Upstream: u, Workload: UpdateOne, Clients: n, Rounds: make(map[Leg][]Round)},
			RoundTrips: make(map[Leg]map[string]float64),
		}
		for _, l := range EnforceLegs {
			cell.RoundTrips[l] = make(map[string]float64)
		}
		err := interleave(cell.Cell, EnforceLegs, cfg.Rounds, cfg.Round, cfg.Warmup, func(l Leg, d time.Duration, warm bool) (Round, error) {
			seed++
			before, err := gw.RoundTrips()
			if err != nil {
				return Round{}, err
			}
			r, err := clients[l].RunRound(ctx, UpdateOne, n, d, 0, cfg.Docs, rec, seed)
			updates[l] += r.Updates
			after, gerr := gw.RoundTrips()
			if err == nil {
				err = gerr
			}
			if !warm {
				addTo(cell.RoundTrips[l], roundTripsDelta(before, after))
			}
			return r, err
		})
		if err != nil {
			return err
		}
		rep.Cells = append(rep.Cells, cell)
		fmt.Fprintln(cfg.Progress, cell.Line())
	}

	// Every acknowledged update is in the documents.
	switch u {
	case InstantUpstream:
		// One set of counters behind both collection names.
		sum, err := direct.SumN(ctx, cfg.Docs)
		if err != nil {
			return err
		}
		want := updates[Direct] + updates[Unprotected] + updates[Enforced]
		if sum != want {
			return fmt.Errorf("documents record %d increments, the clients had %d acknowledged", sum, want)
		}
	case FerretDB:
		open, err := direct.SumN(ctx, cfg.Docs)
		if err != nil {
			return err
		}
		locked, err := directLocked.SumN(ctx, cfg.Docs)
		if err != nil {
			return err
		}
		if want := updates[Direct] + updates[Unprotected]; open != want {
			return fmt.Errorf("%s.%s records %d increments, the clients had %d acknowledged", enforceDB, openColl, open, want)
		}
		if want := updates[Enforced]; locked != want {
			return fmt.Errorf("%s records %d increments, the clients had %d acknowledged", LockedNS, locked, want)
		}
	}
	if cfg.ProxyBinary != "" {
		storeNote += "; lockgate in a process of its own (" + cfg.ProxyBinary + ")"
	}
	rep.Checked[u] = fmt.Sprintf("%s; an update of %s without the lock was refused with LockBusy; all %d enforced updates (and every other leg's) are in the documents (sum of n checked)",
		storeNote, LockedNS, updates[Enforced])
	return nil
}

// lockShares makes session i of n hold the locks on the documents whose
// number ≡ i (mod n), and no other session hold any: every session first
// releases what it holds in the collection, then each of the first n
// acquires its share in one acquireLock.
func lockShares(ctx context.Context, db *mongo.Database, sessions []mongo.Session, n, docs int) error {
	for _, s := range sessions {
		if _, err := releaseLock(ctx, db, s, lockedColl, nil); err != nil {
			return fmt.Errorf("releaseLock: %w", err)
		}
	}
	for i := range n {
		var ids bson.A
		for k := i; k < docs; k += n {
			ids = append(ids, docID(k))
		}
		if _, err := acquireLock(ctx, db, sessions[i], lockedColl, ids, benchLease, 0); err != nil {
			return fmt.Errorf("acquireLock of %d ids in session %d: %w", len(ids), i, err)
		}
	}
	return nil
}

// Line is a one-line summary, for progress output.
func (c *EnforceCell) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "enforce %-8s c=%-2d", c.Upstream, c.Clients)
	for _, l := range EnforceLegs {
		if s, ok := c.Median(l); ok {
			fmt.Fprintf(&b, " | %s %.0f op/s p50 %sµs cpu %sµs/op", l, s.Throughput, us(s.P50), us(s.CPUPerOp))
		}
	}
	if k, ok := c.Kept(Enforced, Unprotected); ok {
		ck, _ := c.CPUKept(Enforced, Unprotected)
		a, _ := c.P50Added(Enforced, Unprotected)
		fmt.Fprintf(&b, " | enforced/unprotected kept %.1f%% (CPU-implied %.1f%%) p50 %+.1fµs", 100*k.Median, 100*ck.Median, a.Median/1e3)
	}
	fmt.Fprintf(&b, " | lock store round trips per enforced write %.4f", c.RoundTripsPerWrite(Enforced))
	return b.String()
}

func opsString(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	ops := make([]string, 0, len(m))
	for op := range m {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	var parts []string
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %.0f", op, m[op]))
	}
	return strings.Join(parts, ", ")
}

// WriteMarkdown writes the report as Markdown tables.
func (r *EnforceReport) WriteMarkdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Enforcement run %s, %s, GOMAXPROCS=%d (NumCPU=%d), %d rounds x %v per leg per cell, %v warm-up, %d documents per collection; took %v. Load average %s before, %s after; this process got %.0f%% of the machine's CPU time.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.GOMAXPROCS, r.NumCPU, cfg.Rounds, cfg.Round, cfg.Warmup, cfg.Docs, r.Took.Round(time.Second),
		r.LoadBefore, r.LoadAfter, 100*r.CPUShare)

	fmt.Fprintln(w, "| upstream | clients | leg | ops/s | p50 µs | p99 µs | CPU µs/op | vs unprotected: throughput kept | vs unprotected: p50 added µs | vs unprotected: CPU added µs/op |")
	fmt.Fprintln(w, "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		for _, l := range EnforceLegs {
			s, ok := c.Median(l)
			if !ok {
				continue
			}
			kept, added, cpu := "", "", ""
			if l != Unprotected {
				if k, ok := c.Kept(l, Unprotected); ok {
					kept = fmt.Sprintf("%.1f%%", 100*k.Median)
				}
				if a, ok := c.P50Added(l, Unprotected); ok {
					added = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
				if a, ok := c.CPUAdded(l, Unprotected); ok {
					cpu = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
			}
			fmt.Fprintf(w, "| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n",
				c.Upstream, c.Clients, l, s.Throughput, us(s.P50), us(s.P99), us(s.CPUPerOp), kept, added, cpu)
		}
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Target (DESIGN §7): enforced vs unprotected, median of the per-round paired comparisons [interquartile range]; lock store round trips counted from the gateway's lockgate_lockstore_round_trips_total over the timed rounds of the enforced leg.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| upstream | clients | throughput kept (≥ 95%) | CPU-implied kept | p50 added | CPU added per op | enforced writes | lock store round trips (by op) | round trips per enforced write |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|---|--:|")
	for _, c := range r.Cells {
		k, ok1 := c.Kept(Enforced, Unprotected)
		ck, ok2 := c.CPUKept(Enforced, Unprotected)
		a, ok3 := c.P50Added(Enforced, Unprotected)
		cpu, ok4 := c.CPUAdded(Enforced, Unprotected)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %.1f%% [%.0f–%.0f] %s | %.1f%% [%.0f–%.0f] | %+.1f µs [%+.1f–%+.1f] | %+.1f µs [%+.1f–%+.1f] | %d | %s | %.4f |\n",
			c.Upstream, c.Clients,
			100*k.Median, 100*k.Q1, 100*k.Q3, verdict(k.Median >= TargetGuard),
			100*ck.Median, 100*ck.Q1, 100*ck.Q3,
			a.Median/1e3, a.Q1/1e3, a.Q3/1e3,
			cpu.Median/1e3, cpu.Q1/1e3, cpu.Q3/1e3,
			c.Writes(Enforced), opsString(c.RoundTrips[Enforced]), c.RoundTripsPerWrite(Enforced))
	}
	fmt.Fprintln(w)
	for _, u := range cfg.Upstreams {
		if s, ok := r.Checked[u]; ok {
			fmt.Fprintf(w, "%s: %s.\n", u, s)
		}
	}
	fmt.Fprintln(w)
}
