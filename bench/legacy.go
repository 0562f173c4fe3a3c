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

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
)

// The legs of the legacy-writer benchmark (issue 23): the same
// updateOne({_id}, {$inc: {n: 1}}) of a writer that holds no lock, with no
// explicit session, through one gateway on the embedded FerretDB.
const (
	// LegacyRefuseIfLocked: a collection enforced with unlockedWriters:
	// refuseIfLocked; every write takes and releases its implicit lock.
	LegacyRefuseIfLocked Leg = "refuseIfLocked"
	// LegacyWait: the same under unlockedWriters: wait.
	LegacyWait Leg = "wait"
)

// LegacyLegs lists the legs; Unprotected is the baseline.
var LegacyLegs = []Leg{Unprotected, LegacyRefuseIfLocked, LegacyWait}

// TargetLegacy is issue 23's goal: an uncontended write under implicit
// locks keeps 90% of the unprotected write's throughput.
const TargetLegacy = 0.9

var legacyColls = map[Leg]string{Unprotected: openColl, LegacyRefuseIfLocked: "legacy_ril", LegacyWait: "legacy_wait"}

// LegacyConfig says what RunLegacy measures.
type LegacyConfig struct {
	Clients  []int
	Rounds   int
	Round    time.Duration
	Warmup   time.Duration
	Docs     int
	Progress io.Writer
}

// DefaultLegacyConfig is about half a minute on a 2-core machine.
func DefaultLegacyConfig() LegacyConfig {
	return LegacyConfig{Clients: []int{1, 4}, Rounds: 7, Round: 300 * time.Millisecond, Warmup: 150 * time.Millisecond, Docs: 64}
}

// LegacyReport is the outcome of RunLegacy.
type LegacyReport struct {
	Config     LegacyConfig
	Started    time.Time
	Took       time.Duration
	GoVersion  string
	GOMAXPROCS int
	LoadBefore string
	LoadAfter  string
	Cells      []*EnforceCell
	// StoreTime is the time the gateway spent in lock store round trips
	// during each cell's timed rounds, by clients, leg and operation, in
	// seconds: where a legacy write's added latency goes.
	StoreTime map[int]map[Leg]map[string]float64
	Checked   string
}

// RunLegacy measures the cost of a legacy writer's write under implicit
// locks (refuseIfLocked, wait), uncontended, against the same write on an
// unprotected collection through the same gateway, legs interleaved.
func RunLegacy(ctx context.Context, cfg LegacyConfig) (_ *LegacyReport, err error) {
	if cfg.Rounds <= 0 || cfg.Round <= 0 || cfg.Docs <= 0 || len(cfg.Clients) == 0 || slices.Max(cfg.Clients) > cfg.Docs {
		return nil, errors.New("bench: legacy: Rounds, Round, Docs and Clients (at most Docs) must be set")
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep := &LegacyReport{Config: cfg, Started: time.Now(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadAvg()}
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
	gw, err := startLegacyGateway(f.URI())
	if err != nil {
		return nil, err
	}
	closers = append(closers, gw.Close)
	maxClients := slices.Max(cfg.Clients)
	clients := make(map[Leg]*Client, len(LegacyLegs))
	for _, l := range LegacyLegs {
		c, err := connectTo(ctx, gw.Addr(), l, enforceDB, legacyColls[l], maxClients)
		if err != nil {
			return nil, err
		}
		closers = append(closers, c.Close)
		clients[l] = c
	}
	direct, err := connectTo(ctx, f.Addr(), Direct, enforceDB, openColl, 1)
	if err != nil {
		return nil, err
	}
	closers = append(closers, direct.Close)
	seeded := map[Leg]*Client{}
	for _, l := range LegacyLegs {
		seeded[l] = &Client{Leg: Direct, client: direct.client, coll: direct.client.Database(enforceDB).Collection(legacyColls[l])}
		if err := seeded[l].Seed(ctx, cfg.Docs); err != nil {
			return nil, err
		}
	}
	// Enforcement must be on: while a session holds a document's lock, the
	// legacy write of it is refused (refuseIfLocked).
	s, err := clients[LegacyRefuseIfLocked].client.StartSession()
	if err != nil {
		return nil, err
	}
	db := clients[LegacyRefuseIfLocked].client.Database(enforceDB)
	if _, err := acquireLock(ctx, db, s, legacyColls[LegacyRefuseIfLocked], bson.A{docID(0)}, 10*time.Second, 0); err != nil {
		return nil, err
	}
	_, werr := clients[LegacyRefuseIfLocked].coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: docID(0)}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int32(1)}}}})
	if _, err := releaseLock(ctx, db, s, legacyColls[LegacyRefuseIfLocked], nil); err != nil {
		return nil, err
	}
	s.EndSession(ctx)
	if !isLockBusy(werr) {
		return nil, fmt.Errorf("a legacy write of a locked document was not refused with LockBusy: %v", werr)
	}

	rep.StoreTime = make(map[int]map[Leg]map[string]float64)
	rec := NewRecorder(maxClients, 1<<16)
	updates := make(map[Leg]int64)
	seed := uint64(time.Now().UnixNano())
	for _, n := range cfg.Clients {
		cell := &EnforceCell{Cell: &Cell{Upstream: FerretDB, Workload: UpdateOne, Clients: n, Rounds: make(map[Leg][]Round)},
			RoundTrips: make(map[Leg]map[string]float64)}
		rep.StoreTime[n] = make(map[Leg]map[string]float64)
		for _, l := range LegacyLegs {
			cell.RoundTrips[l] = make(map[string]float64)
			rep.StoreTime[n][l] = make(map[string]float64)
		}
		err := interleave(cell.Cell, LegacyLegs, cfg.Rounds, cfg.Round, cfg.Warmup, func(l Leg, d time.Duration, warm bool) (Round, error) {
			seed++
			before, err := gw.RoundTrips()
			if err != nil {
				return Round{}, err
			}
			tBefore, err := gw.roundTripTime()
			if err != nil {
				return Round{}, err
			}
			r, err := clients[l].RunRound(ctx, UpdateOne, n, d, 0, cfg.Docs, rec, seed)
			updates[l] += r.Updates
			after, gerr := gw.RoundTrips()
			if err == nil {
				err = gerr
			}
			tAfter, gerr := gw.roundTripTime()
			if err == nil {
				err = gerr
			}
			if !warm {
				addTo(cell.RoundTrips[l], roundTripsDelta(before, after))
				addTo(rep.StoreTime[n][l], roundTripsDelta(tBefore, tAfter))
			}
			return r, err
		})
		if err != nil {
			return nil, err
		}
		rep.Cells = append(rep.Cells, cell)
		fmt.Fprintln(cfg.Progress, legacyLine(cell))
	}
	for _, l := range LegacyLegs {
		sum, err := seeded[l].SumN(ctx, cfg.Docs)
		if err != nil {
			return nil, err
		}
		if sum != updates[l] {
			return nil, fmt.Errorf("%s: the documents record %d increments, the clients had %d acknowledged", l, sum, updates[l])
		}
	}
	rep.Checked = "a legacy write of a locked document was refused with LockBusy; every leg's acknowledged increments are in its documents (sum of n checked)"
	rep.Took = time.Since(rep.Started)
	rep.LoadAfter = loadAvg()
	return rep, nil
}

// startLegacyGateway is StartGateway with the two legacy collections
// enforced under unlockedWriters refuseIfLocked and wait, and the lock
// store on the upstream.
func startLegacyGateway(uri string) (*Gateway, error) {
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URI = uri
	cfg.Upstream.DialTimeout = config.Duration(5 * time.Second)
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	cfg.Policy.Namespaces = []config.NamespaceRule{
		{Match: enforceDB + "." + legacyColls[LegacyRefuseIfLocked], Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedRefuseIfLocked},
		{Match: enforceDB + "." + legacyColls[LegacyWait], Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedWait},
	}
	logger, err := gateway.NewLoggerTo(cfg.Log, io.Discard)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := gateway.Start(ctx, cfg, logger)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Gateway{gw: gw, cancel: cancel}, nil
}

func legacyLine(c *EnforceCell) string {
	s := fmt.Sprintf("legacy c=%d", c.Clients)
	for _, l := range LegacyLegs {
		if m, ok := c.Median(l); ok {
			s += fmt.Sprintf(" | %s %.0f op/s p50 %sµs", l, m.Throughput, us(m.P50))
		}
		if l != Unprotected {
			if k, ok := c.Kept(l, Unprotected); ok {
				s += fmt.Sprintf(" kept %.1f%%", 100*k.Median)
			}
			s += " lock store " + roundTripsByOp(c, l)
		}
	}
	return s
}

// roundTripsByOp spells leg l's lock store round trips per write by
// operation, largest first: where a legacy write's cost goes.
func roundTripsByOp(c *EnforceCell, l Leg) string {
	w := float64(max(c.Writes(l), 1))
	ops := make([]string, 0, len(c.RoundTrips[l]))
	for op := range c.RoundTrips[l] {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int {
		if d := c.RoundTrips[l][b] - c.RoundTrips[l][a]; d != 0 {
			return int(d)
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(ops))
	for i, op := range ops {
		parts[i] = fmt.Sprintf("%s %.2f", op, c.RoundTrips[l][op]/w)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// WriteMarkdown writes the report as a Markdown table.
func (r *LegacyReport) WriteMarkdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Legacy-writer run %s, %s, GOMAXPROCS=%d, %d rounds x %v per leg per cell, %v warm-up, %d documents per collection, embedded FerretDB with the lock store on it; took %v. Load average %s before, %s after.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.GOMAXPROCS, cfg.Rounds, cfg.Round, cfg.Warmup, cfg.Docs, r.Took.Round(time.Second), r.LoadBefore, r.LoadAfter)
	fmt.Fprintln(w, "| clients | leg | ops/s | p50 µs | p99 µs | vs unprotected: throughput kept (goal ≥ 90%) [IQR] | p50 added µs | lock store round trips per write |")
	fmt.Fprintln(w, "|--:|---|--:|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		for _, l := range LegacyLegs {
			s, ok := c.Median(l)
			if !ok {
				continue
			}
			kept, added := "", ""
			if l != Unprotected {
				if k, ok := c.Kept(l, Unprotected); ok {
					kept = fmt.Sprintf("%.1f%% [%.0f–%.0f] %s", 100*k.Median, 100*k.Q1, 100*k.Q3, verdict(k.Median >= TargetLegacy))
				}
				if a, ok := c.P50Added(l, Unprotected); ok {
					added = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
			}
			fmt.Fprintf(w, "| %d | %s | %.0f | %s | %s | %s | %s | %.2f |\n", c.Clients, l, s.Throughput, us(s.P50), us(s.P99), kept, added, c.RoundTripsPerWrite(l))
		}
	}
	fmt.Fprintln(w, "\nLock store round trips per write, by operation, and the time the gateway spent in them per write (summed over concurrent writes):")
	fmt.Fprintln(w)
	for _, c := range r.Cells {
		for _, l := range LegacyLegs[1:] {
			fmt.Fprintf(w, "- %d clients, %s: %s; %s\n", c.Clients, l, roundTripsByOp(c, l), r.storeTimeByOp(c, l))
		}
	}
	fmt.Fprintf(w, "\nChecked: %s.\n", r.Checked)
}

// storeTimeByOp spells the lock store time per write of leg l in cell c,
// in microseconds, total first.
func (r *LegacyReport) storeTimeByOp(c *EnforceCell, l Leg) string {
	m := r.StoreTime[c.Clients][l]
	w := float64(max(c.Writes(l), 1))
	ops := make([]string, 0, len(m))
	for op := range m {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	s := fmt.Sprintf("%.0f µs in the lock store", total(m)/w*1e6)
	for _, op := range ops[:min(len(ops), 3)] {
		s += fmt.Sprintf(", %s %.0f", op, m[op]/w*1e6)
	}
	return s
}

// roundTripTime reads the sums of lockgate_lockstore_round_trip_seconds
// from the gateway's registry, by operation.
func (g *Gateway) roundTripTime() (map[string]float64, error) {
	mfs, err := g.gw.Registry().Gather()
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		if mf.GetName() != "lockgate_lockstore_round_trip_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "op" {
					out[lp.GetValue()] += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return out, nil
}
