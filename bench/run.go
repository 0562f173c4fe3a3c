package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"
)

// Config says what Run measures and for how long.
type Config struct {
	Upstreams []Upstream
	Workloads []Workload
	Clients   []int // concurrent clients per leg, e.g. 1, 16, 32
	// Legs defaults to AllLegs. The ratios need Relayed and Lockgate.
	Legs []Leg
	// Rounds is how many times each leg runs per cell, interleaved with the
	// others; the report takes the median.
	Rounds int
	// Round is how long each leg runs per round.
	Round time.Duration
	// Warmup runs each leg once per cell, untimed, to fill the driver's
	// connection pool and the proxy's buffer pools.
	Warmup time.Duration
	// Docs is how many documents are seeded; operations pick one at random.
	Docs int
	// IdleConns is how many idle connections the memory figure opens per
	// leg; 0 skips it. It is measured on the instant upstream only.
	IdleConns int
	// IdleRounds repeats the memory figure; the report takes the median.
	IdleRounds int
	// Progress receives a line per finished cell; nil discards.
	Progress io.Writer
}

// DefaultConfig is the full run: about two and a half minutes on a 2-core
// machine.
func DefaultConfig() Config {
	return Config{
		Upstreams:  AllUpstreams,
		Workloads:  AllWorkloads,
		Clients:    []int{1, 16, 32},
		Legs:       AllLegs,
		Rounds:     9,
		Round:      300 * time.Millisecond,
		Warmup:     150 * time.Millisecond,
		Docs:       1000,
		IdleConns:  500,
		IdleRounds: 3,
	}
}

// Cell is one (upstream, workload, clients) combination: every round of
// every leg.
type Cell struct {
	Upstream Upstream
	Workload Workload
	Clients  int
	// Rounds[leg][i] is round i of that leg; round i of every leg ran
	// back to back.
	Rounds map[Leg][]Round
}

// Summary is the median of a leg's rounds.
type Summary struct {
	Throughput float64 // ops/s
	P50, P99   time.Duration
	CPUPerOp   time.Duration // process CPU per operation
}

// Median summarises leg l.
func (c *Cell) Median(l Leg) (Summary, bool) {
	rs := c.Rounds[l]
	if len(rs) == 0 {
		return Summary{}, false
	}
	var thr, p50, p99, cpu []float64
	for _, r := range rs {
		thr = append(thr, r.Throughput())
		p50 = append(p50, float64(r.P50))
		p99 = append(p99, float64(r.P99))
		cpu = append(cpu, float64(r.CPUPerOp()))
	}
	return Summary{
		Throughput: median(thr),
		P50:        time.Duration(median(p50)),
		P99:        time.Duration(median(p99)),
		CPUPerOp:   time.Duration(median(cpu)),
	}, true
}

// Spread is the median and interquartile range of a per-round paired
// comparison between two legs.
type Spread struct {
	Median, Q1, Q3 float64
}

// Kept compares leg a's throughput with leg b's: the ratio of each round's
// pair, measured back to back.
func (c *Cell) Kept(a, b Leg) (Spread, bool) {
	return c.paired(a, b, func(ra, rb Round) float64 { return ra.Throughput() / rb.Throughput() })
}

// CPUKept is the throughput ratio that CPU cost alone implies: leg b's CPU
// per operation over leg a's. When the machine's cores are the limit, a
// leg's throughput is the CPU it gets over its CPU per operation, so this
// is what Kept tends to on a quiet machine; unlike Kept, it hardly moves
// when other processes take the cores.
func (c *Cell) CPUKept(a, b Leg) (Spread, bool) {
	return c.paired(a, b, func(ra, rb Round) float64 { return float64(rb.CPUPerOp()) / float64(ra.CPUPerOp()) })
}

// P50Added compares leg a's p50 latency with leg b's, in nanoseconds.
func (c *Cell) P50Added(a, b Leg) (Spread, bool) {
	return c.paired(a, b, func(ra, rb Round) float64 { return float64(ra.P50 - rb.P50) })
}

// CPUAdded compares leg a's process CPU per operation with leg b's, in
// nanoseconds.
func (c *Cell) CPUAdded(a, b Leg) (Spread, bool) {
	return c.paired(a, b, func(ra, rb Round) float64 { return float64(ra.CPUPerOp() - rb.CPUPerOp()) })
}

func (c *Cell) paired(a, b Leg, f func(ra, rb Round) float64) (Spread, bool) {
	ra, rb := c.Rounds[a], c.Rounds[b]
	if len(ra) == 0 || len(ra) != len(rb) {
		return Spread{}, false
	}
	var xs []float64
	for i := range ra {
		xs = append(xs, f(ra[i], rb[i]))
	}
	q1, q3 := quartiles(xs)
	return Spread{Median: median(xs), Q1: q1, Q3: q3}, true
}

// Report is the outcome of Run.
type Report struct {
	Config     Config
	Started    time.Time
	Took       time.Duration
	GoVersion  string
	GOMAXPROCS int
	NumCPU     int
	Cells      []*Cell
	Idle       *Idle
	// UpdatesVerified says, per upstream, that the sum of n over the
	// documents equals the updates acknowledged during the run.
	UpdatesVerified map[Upstream]bool
}

// Run measures every cell of cfg and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if len(cfg.Legs) == 0 {
		cfg.Legs = AllLegs
	}
	if cfg.Rounds <= 0 || cfg.Round <= 0 || cfg.Docs <= 0 || len(cfg.Clients) == 0 {
		return nil, errors.New("bench: Rounds, Round, Docs and Clients must be set")
	}
	for _, l := range cfg.Legs {
		if !slices.Contains(AllLegs, l) {
			return nil, fmt.Errorf("bench: unknown leg %q (want one of %v)", l, AllLegs)
		}
	}
	for _, u := range cfg.Upstreams {
		if !slices.Contains(AllUpstreams, u) {
			return nil, fmt.Errorf("bench: unknown upstream %q (want one of %v)", u, AllUpstreams)
		}
	}
	for _, w := range cfg.Workloads {
		if !slices.Contains(AllWorkloads, w) {
			return nil, fmt.Errorf("bench: unknown workload %q (want one of %v)", w, AllWorkloads)
		}
	}
	if slices.Max(cfg.Clients) > cfg.Docs {
		return nil, fmt.Errorf("bench: %d documents cannot be shared by %d clients", cfg.Docs, slices.Max(cfg.Clients))
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep := &Report{
		Config:          cfg,
		Started:         time.Now(),
		GoVersion:       runtime.Version(),
		GOMAXPROCS:      runtime.GOMAXPROCS(0),
		NumCPU:          runtime.NumCPU(),
		UpdatesVerified: make(map[Upstream]bool),
	}
	for _, u := range cfg.Upstreams {
		if err := runUpstream(ctx, cfg, u, rep); err != nil {
			return rep, err
		}
	}
	rep.Took = time.Since(rep.Started)
	return rep, nil
}

func runUpstream(ctx context.Context, cfg Config, u Upstream, rep *Report) (err error) {
	st, err := StartStack(u, cfg.Docs)
	if err != nil {
		return fmt.Errorf("start %s: %w", u, err)
	}
	defer func() {
		if cerr := st.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	// The memory figure comes first, while no driver client holds
	// connections or runs monitors in the process.
	if u == InstantUpstream && cfg.IdleConns > 0 {
		idle, err := MeasureIdle(st, cfg.Legs, cfg.IdleConns, max(cfg.IdleRounds, 1))
		if err != nil {
			return fmt.Errorf("idle connections: %w", err)
		}
		rep.Idle = idle
		fmt.Fprintf(cfg.Progress, "idle connection memory: %s\n", idle.Line())
	}

	maxClients := slices.Max(cfg.Clients)
	collection := fmt.Sprintf("docs_%d", time.Now().UnixNano())
	clients := make(map[Leg]*Client, len(cfg.Legs))
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for _, l := range cfg.Legs {
		c, err := Connect(ctx, st, l, collection, maxClients)
		if err != nil {
			return err
		}
		clients[l] = c
	}
	first := clients[cfg.Legs[0]]
	if err := first.Seed(ctx, cfg.Docs); err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}

	rec := NewRecorder(maxClients, 1<<16)
	var updates int64
	seed := uint64(time.Now().UnixNano())
	for _, w := range cfg.Workloads {
		for _, n := range cfg.Clients {
			cell := &Cell{Upstream: u, Workload: w, Clients: n, Rounds: make(map[Leg][]Round)}
			err := interleave(cell, cfg.Legs, cfg.Rounds, cfg.Round, cfg.Warmup, func(l Leg, d time.Duration, _ bool) (Round, error) {
				seed++
				r, err := clients[l].RunRound(ctx, w, n, d, 0, cfg.Docs, rec, seed)
				updates += r.Updates
				return r, err
			})
			if err != nil {
				return fmt.Errorf("%s: %w", u, err)
			}
			rep.Cells = append(rep.Cells, cell)
			fmt.Fprintln(cfg.Progress, cell.Line(cfg.Legs))
		}
	}

	sum, err := first.SumN(ctx, cfg.Docs)
	if err != nil {
		return fmt.Errorf("%s: verifying updates: %w", u, err)
	}
	if sum != updates {
		return fmt.Errorf("%s: documents record %d increments, the clients had %d acknowledged", u, sum, updates)
	}
	rep.UpdatesVerified[u] = true
	return nil
}

// interleave fills cell.Rounds: an untimed warm-up of every leg (when
// warmup > 0), then rounds rounds in which every leg runs once for d, the
// order rotated every round so that no leg always runs first or right after
// the same neighbour. run runs one leg for the given time; warm says that
// the round is the untimed warm-up.
func interleave(cell *Cell, legs []Leg, rounds int, d, warmup time.Duration, run func(l Leg, d time.Duration, warm bool) (Round, error)) error {
	if warmup > 0 {
		for _, l := range legs {
			if _, err := run(l, warmup, true); err != nil {
				return fmt.Errorf("warmup: %w", err)
			}
		}
	}
	for i := range rounds {
		for j := range legs {
			l := legs[(i+j)%len(legs)]
			r, err := run(l, d, false)
			if err != nil {
				return err
			}
			cell.Rounds[l] = append(cell.Rounds[l], r)
		}
	}
	return nil
}
