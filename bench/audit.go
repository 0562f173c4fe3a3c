package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// The legs of the audit family: the enforce family's enforced update,
// through three gateways that differ only in their audit trail. Each has
// a lock database of its own, so that every leg's sessions hold the locks
// on their documents at once.
const (
	// NoTrail: audit.enabled false.
	NoTrail Leg = "noTrail"
	// TrailBestEffort: the trail's file sink in mode bestEffort: the
	// record is handed to the writer and the write goes on.
	TrailBestEffort Leg = "bestEffort"
	// TrailRequired: mode required: each write is forwarded once its
	// record is fsynced.
	TrailRequired Leg = "required"
)

// AuditLegs lists the legs of the audit family.
var AuditLegs = []Leg{NoTrail, TrailBestEffort, TrailRequired}

// TargetTrail: with the trail in bestEffort mode, an enforced write keeps
// at least 95% of its throughput without it (issue 24).
const TargetTrail = 0.95

// AuditConfig says what RunAudit measures.
type AuditConfig struct {
	Upstreams []Upstream
	Clients   []int
	Rounds    int
	Round     time.Duration
	Warmup    time.Duration
	// Docs is how many documents the collection has; client i of n
	// locks and writes the ones whose number ≡ i (mod n) on every leg.
	Docs int
	// Dir is where the trails' directories are made (and removed after);
	// empty: the system's temporary directory. Its disk sets the required
	// leg's figures: each of its batches is fsynced.
	Dir      string
	Progress io.Writer
}

// DefaultAuditConfig is the default run: about 40 seconds on a 2-core
// machine.
func DefaultAuditConfig() AuditConfig {
	return AuditConfig{
		Upstreams: AllUpstreams,
		Clients:   []int{16},
		Rounds:    7,
		Round:     300 * time.Millisecond,
		Warmup:    150 * time.Millisecond,
		Docs:      64,
	}
}

// AuditReport is the outcome of RunAudit.
type AuditReport struct {
	Config     AuditConfig
	Started    time.Time
	Took       time.Duration
	GoVersion  string
	GOMAXPROCS int
	NumCPU     int
	LoadBefore string
	LoadAfter  string
	CPUShare   float64
	Cells      []*Cell
	// Checked says, per upstream, what was verified about the run.
	Checked map[Upstream]string
}

// RunAudit measures the audit trail's cost on enforced writes: the same
// _id-pinned update under held locks through a gateway without a trail,
// with one in bestEffort mode and with one in required mode, interleaved.
// After each upstream it closes the gateways and verifies both trails:
// every acknowledged write of the required leg has its allow record, and
// every one of the bestEffort leg has one or is counted in a dropped
// record.
func RunAudit(ctx context.Context, cfg AuditConfig) (*AuditReport, error) {
	if cfg.Rounds <= 0 || cfg.Round <= 0 || cfg.Docs <= 0 || len(cfg.Clients) == 0 {
		return nil, errors.New("bench: audit: Rounds, Round, Docs and Clients must be set")
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
	rep := &AuditReport{
		Config: cfg, Started: time.Now(), GoVersion: runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
		LoadBefore: loadAvg(), Checked: make(map[Upstream]string),
	}
	cpu0 := processCPU()
	for _, u := range cfg.Upstreams {
		if err := runAuditUpstream(ctx, cfg, u, rep); err != nil {
			return rep, fmt.Errorf("audit %s: %w", u, err)
		}
	}
	rep.Took = time.Since(rep.Started)
	rep.CPUShare = float64(processCPU()-cpu0) / float64(rep.Took) / float64(rep.NumCPU)
	rep.LoadAfter = loadAvg()
	return rep, nil
}

// auditGateway is one leg's gateway and where its trail is.
type auditGateway struct {
	gw     *Gateway
	dir    string // "" without a trail
	closed bool
}

func (g *auditGateway) close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	return g.gw.Close()
}

func runAuditUpstream(ctx context.Context, cfg AuditConfig, u Upstream, rep *AuditReport) (err error) {
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	var upAddr, lockURI string
	switch u {
	case InstantUpstream:
		in, err := StartInstant(cfg.Docs, payload)
		if err != nil {
			return err
		}
		closers = append(closers, in.Close)
		upAddr = in.Addr()
		f, err := startFerret()
		if err != nil {
			return err
		}
		closers = append(closers, f.Close)
		lockURI = f.URI()
	case FerretDB:
		f, err := startFerret()
		if err != nil {
			return err
		}
		closers = append(closers, f.Close)
		upAddr = f.Addr()
	}
	root, err := os.MkdirTemp(cfg.Dir, "lockgate-bench-audit-")
	if err != nil {
		return err
	}
	closers = append(closers, func() error { return os.RemoveAll(root) })
	keyFile := filepath.Join(root, "key")
	secret := make([]byte, 32)
	rand.Read(secret)
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(secret)), 0o600); err != nil {
		return err
	}
	key, err := audittrail.KeyFromFile(keyFile)
	if err != nil {
		return err
	}

	maxClients := slices.Max(cfg.Clients)
	gws := make(map[Leg]*auditGateway, len(AuditLegs))
	clients := make(map[Leg]*Client, len(AuditLegs))
	for _, l := range AuditLegs {
		gcfg := enforceConfig("mongodb://"+upAddr+"/", lockURI, LockedNS)
		gcfg.Lockstore.Database = "lockgate_" + string(l)
		g := &auditGateway{}
		if l != NoTrail {
			g.dir = filepath.Join(root, string(l))
			gcfg.Audit = config.Default().Audit
			gcfg.Audit.Enabled, gcfg.Audit.Dir, gcfg.Audit.KeyFile, gcfg.Audit.Instance = true, g.dir, keyFile, "bench-"+string(l)
			if l == TrailRequired {
				gcfg.Audit.Mode = config.AuditRequired
			}
		}
		// Every goroutine of the leg's gateway (its trail's writer
		// included) and of its clients carries the label leg=<leg>, so a
		// CPU profile of the run (-cpuprofile) splits by leg:
		// go tool pprof -tagfocus leg=bestEffort.
		var c *Client
		pprof.Do(ctx, pprof.Labels("leg", string(l)), func(ctx context.Context) {
			if g.gw, err = startGateway(gcfg); err != nil {
				err = fmt.Errorf("%s gateway: %w", l, err)
				return
			}
			gws[l] = g
			closers = append(closers, g.close)
			c, err = connectTo(ctx, g.gw.Addr(), l, enforceDB, lockedColl, maxClients)
		})
		if err != nil {
			return err
		}
		closers = append(closers, c.Close)
		if err := c.StartSessions(maxClients); err != nil {
			return err
		}
		clients[l] = c
	}
	direct, err := connectTo(ctx, upAddr, Direct, enforceDB, lockedColl, 2)
	if err != nil {
		return err
	}
	closers = append(closers, direct.Close)
	if err := direct.Seed(ctx, cfg.Docs); err != nil {
		return err
	}
	for _, l := range AuditLegs {
		c := clients[l]
		_, werr := c.coll.UpdateOne(mongo.NewSessionContext(ctx, c.sessions[0]), bson.D{{Key: "_id", Value: docID(0)}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int32(1)}}}})
		if !isLockBusy(werr) {
			return fmt.Errorf("%s: an update of %s without the lock was not refused with LockBusy: %v", l, LockedNS, werr)
		}
	}

	rec := NewRecorder(maxClients, 1<<16)
	updates := make(map[Leg]int64)
	seed := uint64(time.Now().UnixNano())
	for _, n := range cfg.Clients {
		for _, l := range AuditLegs {
			c := clients[l]
			if err := lockShares(ctx, c.client.Database(enforceDB), c.sessions, n, cfg.Docs); err != nil {
				return fmt.Errorf("%s: %w", l, err)
			}
		}
		cell := &Cell{Upstream: u, Workload: UpdateOne, Clients: n, Rounds: make(map[Leg][]Round)}
		err := interleave(cell, AuditLegs, cfg.Rounds, cfg.Round, cfg.Warmup, func(l Leg, d time.Duration, _ bool) (Round, error) {
			seed++
			var r Round
			var err error
			pprof.Do(ctx, pprof.Labels("leg", string(l)), func(ctx context.Context) {
				r, err = clients[l].RunRound(ctx, UpdateOne, n, d, 0, cfg.Docs, rec, seed)
			})
			updates[l] += r.Updates
			return r, err
		})
		if err != nil {
			return err
		}
		rep.Cells = append(rep.Cells, cell)
		fmt.Fprintln(cfg.Progress, cell.auditLine())
	}

	sum, err := direct.SumN(ctx, cfg.Docs)
	if err != nil {
		return err
	}
	var want int64
	for _, l := range AuditLegs {
		want += updates[l]
	}
	if sum != want {
		return fmt.Errorf("the documents record %d increments, the clients had %d acknowledged", sum, want)
	}
	// The trails end with their stop record and checkpoint once the
	// gateways are closed.
	var notes []string
	for _, l := range AuditLegs[1:] {
		g := gws[l]
		if err := g.close(); err != nil {
			return fmt.Errorf("%s gateway: %w", l, err)
		}
		allowed, dropped, err := countTrail(g.dir, key)
		if err != nil {
			return fmt.Errorf("%s trail: %w", l, err)
		}
		switch {
		case l == TrailRequired && allowed != updates[l]:
			return fmt.Errorf("required trail: %d allow records of %s for %d acknowledged writes", allowed, LockedNS, updates[l])
		case allowed+dropped < updates[l]:
			return fmt.Errorf("%s trail: %d allow records of %s and %d dropped for %d acknowledged writes", l, allowed, LockedNS, dropped, updates[l])
		}
		notes = append(notes, fmt.Sprintf("%s: %d writes, %d allow records, %d dropped", l, updates[l], allowed, dropped))
	}
	rep.Checked[u] = fmt.Sprintf("an update without the lock refused with LockBusy on each gateway; all %d updates in the documents; both trails verify (chain and signatures) after the gateways stopped; %s",
		want, strings.Join(notes, "; "))
	return nil
}

// countTrail verifies the trail in dir and counts its allow records on
// the benchmark's namespace and the records its dropped records stand
// for.
func countTrail(dir string, key audittrail.Key) (allowed, dropped int64, err error) {
	r, err := audittrail.Verify(dir, []audittrail.Key{key})
	if err != nil {
		return 0, 0, err
	}
	if !r.OK() {
		return 0, 0, errors.New(r.Verdict())
	}
	err = audittrail.Read(dir, func(rec *audittrail.Record) error {
		switch {
		case rec.Kind == audittrail.KindDecision && rec.NS == LockedNS && rec.Verdict == audittrail.VerdictAllow:
			allowed++
		case rec.Kind == audittrail.KindDropped:
			dropped += int64(rec.Count)
		}
		return nil
	})
	return allowed, dropped, err
}

// auditLine is a cell's one-line summary for progress output.
func (c *Cell) auditLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "audit %-8s c=%-2d", c.Upstream, c.Clients)
	for _, l := range AuditLegs {
		if s, ok := c.Median(l); ok {
			fmt.Fprintf(&b, " | %s %.0f op/s p50 %sµs cpu %sµs/op", l, s.Throughput, us(s.P50), us(s.CPUPerOp))
		}
	}
	for _, l := range AuditLegs[1:] {
		if k, ok := c.Kept(l, NoTrail); ok {
			ck, _ := c.CPUKept(l, NoTrail)
			fmt.Fprintf(&b, " | %s kept %.1f%% (CPU-implied %.1f%%)", l, 100*k.Median, 100*ck.Median)
		}
	}
	return b.String()
}

// WriteMarkdown writes the report as Markdown tables.
func (r *AuditReport) WriteMarkdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Audit trail run %s, %s, GOMAXPROCS=%d (NumCPU=%d), %d rounds x %v per leg per cell, %v warm-up, %d documents; took %v. Load average %s before, %s after; this process got %.0f%% of the machine's CPU time.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.GOMAXPROCS, r.NumCPU, cfg.Rounds, cfg.Round, cfg.Warmup, cfg.Docs, r.Took.Round(time.Second),
		r.LoadBefore, r.LoadAfter, 100*r.CPUShare)
	fmt.Fprintln(w, "| upstream | clients | leg | ops/s | p50 µs | p99 µs | CPU µs/op | vs noTrail: throughput kept [IQR] | CPU-implied kept [IQR] | p50 added µs | CPU added µs/op |")
	fmt.Fprintln(w, "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		for _, l := range AuditLegs {
			s, ok := c.Median(l)
			if !ok {
				continue
			}
			var kept, ckept, added, cpu string
			if l != NoTrail {
				if k, ok := c.Kept(l, NoTrail); ok {
					kept = fmt.Sprintf("%.1f%% [%.0f–%.0f]", 100*k.Median, 100*k.Q1, 100*k.Q3)
					if l == TrailBestEffort {
						kept += " " + verdict(k.Median >= TargetTrail)
					}
				}
				if k, ok := c.CPUKept(l, NoTrail); ok {
					ckept = fmt.Sprintf("%.1f%% [%.0f–%.0f]", 100*k.Median, 100*k.Q1, 100*k.Q3)
				}
				if a, ok := c.P50Added(l, NoTrail); ok {
					added = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
				if a, ok := c.CPUAdded(l, NoTrail); ok {
					cpu = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
			}
			fmt.Fprintf(w, "| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n",
				c.Upstream, c.Clients, l, s.Throughput, us(s.P50), us(s.P99), us(s.CPUPerOp), kept, ckept, added, cpu)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Target (issue 24): bestEffort vs noTrail throughput kept ≥ 95%; required: the cost, written down. Medians of the per-round paired comparisons.")
	fmt.Fprintln(w)
	for _, u := range cfg.Upstreams {
		if s, ok := r.Checked[u]; ok {
			fmt.Fprintf(w, "- %s: %s\n", u, s)
		}
	}
}
