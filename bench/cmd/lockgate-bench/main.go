// Command lockgate-bench measures what lockgate costs, in three families
// (see docs/BENCHMARKS.md), and prints Markdown tables. The proxy family
// runs the same Go driver workload directly, through a plain TCP relay and
// through the lockgate proxy, against the embedded FerretDB and an instant
// in-process upstream. The enforce family runs an _id-pinned update
// directly, through the full gateway on an unprotected collection, and on
// an enforced one under locks the writing sessions hold. The locks family
// measures acquireLock+releaseLock throughput and the handoff from a
// releasing holder to a waiter, on one gateway and across two, against a
// client that retries every 100 ms. The hostile family measures
// well-behaved lock-write-release clients alone and while attackers hold
// idle connections, flood slow filters and pipeline junk lock commands
// (docs/RELIABILITY.md). Legs are interleaved in every family but hostile.
//
//	go run ./bench/cmd/lockgate-bench                          # all three, about 5 minutes
//	go run ./bench/cmd/lockgate-bench -families enforce,locks  # about 1½ minutes
//	go run ./bench/cmd/lockgate-bench -families proxy -round 2s
//	go run ./bench/cmd/lockgate-bench -families audit    # the audit trail's cost, about 40 s
//	go run ./bench/cmd/lockgate-bench -families hostile                 # about a minute
//	go run ./bench/cmd/lockgate-bench -families hostile -hostile-short  # CI: about 30 s
//	go run ./bench/cmd/lockgate-bench -families proxy -upstreams instant -legs lockgate \
//	    -workloads findOne -clients 16 -idle 0 -cpuprofile cpu.out
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lockgate-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	def := bench.DefaultConfig()
	edef := bench.DefaultEnforceConfig()
	ldef := bench.DefaultLockConfig()
	adef := bench.DefaultAuditConfig()
	var (
		families  = flag.String("families", "proxy,enforce,locks", "benchmark families to run: proxy, enforce, locks, hostile, legacy, audit")
		upstreams = flag.String("upstreams", join(def.Upstreams), "upstreams to measure: instant, ferretdb")
		workloads = flag.String("workloads", join(def.Workloads), "workloads: findOne, updateOne")
		legs      = flag.String("legs", join(def.Legs), "legs: direct, relay, lockgate")
		clients   = flag.String("clients", "1,16,32", "concurrent clients per leg")
		rounds    = flag.Int("rounds", def.Rounds, "interleaved rounds per cell; the median is reported")
		round     = flag.Duration("round", def.Round, "how long each leg runs per round")
		warmup    = flag.Duration("warmup", def.Warmup, "untimed run of each leg before each cell")
		docs      = flag.Int("docs", def.Docs, "documents seeded")
		idle      = flag.Int("idle", def.IdleConns, "idle connections per leg for the memory figure; 0 skips it")

		eUpstreams = flag.String("enforce-upstreams", join(edef.Upstreams), "enforce: upstreams to measure: instant, ferretdb")
		eClients   = flag.String("enforce-clients", "1,16", "enforce: concurrent clients per leg")
		eRounds    = flag.Int("enforce-rounds", edef.Rounds, "enforce: interleaved rounds per cell")
		eRound     = flag.Duration("enforce-round", edef.Round, "enforce: how long each leg runs per round")
		eWarmup    = flag.Duration("enforce-warmup", edef.Warmup, "enforce: untimed run of each leg before each cell")
		eDocs      = flag.Int("enforce-docs", edef.Docs, "enforce: documents (and lock keys) per collection")
		eProxy     = flag.String("enforce-proxy", "", "enforce: a lockgate binary to run in a process of its own, as a sidecar runs (go build -o lockgate ./cmd/proxy); empty: lockgate in this process")

		aUpstreams = flag.String("audit-upstreams", join(adef.Upstreams), "audit: upstreams to measure: instant, ferretdb")
		aClients   = flag.String("audit-clients", "16", "audit: concurrent clients per leg")
		aRounds    = flag.Int("audit-rounds", adef.Rounds, "audit: interleaved rounds per cell")
		aRound     = flag.Duration("audit-round", adef.Round, "audit: how long each leg runs per round")
		aDir       = flag.String("audit-dir", "", "audit: where the trails are written (its disk sets the required leg's fsyncs); empty: the temporary directory")

		lRounds     = flag.Int("locks-rounds", ldef.Rounds, "locks: interleaved rounds (throughput legs and handoff setups)")
		lRound      = flag.Duration("locks-round", ldef.Round, "locks: how long each throughput leg runs per round")
		lClients    = flag.String("locks-clients", "1,8", "locks: client counts of the uncontended legs")
		lContenders = flag.Int("locks-contenders", ldef.Contenders, "locks: clients sharing one key in the contended leg")
		lHandoffs   = flag.Int("locks-handoffs", ldef.Handoffs, "locks: handoffs per setup per round")
		lHold       = flag.String("locks-hold", fmt.Sprintf("%v,%v", ldef.HoldMin, ldef.HoldMax), "locks: min,max time a holder keeps the lock while the waiter waits")
		lPoll       = flag.Duration("locks-poll", ldef.Poll, "locks: retry interval of the polling baseline")

		hShort      = flag.Bool("hostile-short", false, "hostile: the short CI form (fewer attackers, 5 s phases, fails if the gateway stops or grows by over 1 GiB)")
		hPhase      = flag.Duration("hostile-phase", 0, "hostile: length of each phase (quiet, attack, quiet); 0 keeps the form's")
		hIdle       = flag.Int("hostile-idle", -1, "hostile: idle connections; -1 keeps the form's")
		hFlooders   = flag.Int("hostile-flooders", -1, "hostile: clients flooding slow filters; -1 keeps the form's")
		hPipeliners = flag.Int("hostile-pipeliners", -1, "hostile: connections pipelining junk lock commands; -1 keeps the form's")
		hGood       = flag.Int("hostile-good", -1, "hostile: well-behaved clients; -1 keeps the form's")

		cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
		memprofile = flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	)
	flag.Parse()

	fams := split[string](*families)
	for _, f := range fams {
		if f != "proxy" && f != "enforce" && f != "locks" && f != "hostile" && f != "legacy" && f != "audit" {
			return fmt.Errorf("-families: unknown family %q (want proxy, enforce, locks, hostile, legacy, audit)", f)
		}
	}
	cfg := def
	cfg.Upstreams = split[bench.Upstream](*upstreams)
	cfg.Workloads = split[bench.Workload](*workloads)
	cfg.Legs = split[bench.Leg](*legs)
	var err error
	if cfg.Clients, err = counts("-clients", *clients); err != nil {
		return err
	}
	cfg.Rounds, cfg.Round, cfg.Warmup, cfg.Docs, cfg.IdleConns = *rounds, *round, *warmup, *docs, *idle
	cfg.Progress = os.Stderr

	ecfg := edef
	ecfg.Upstreams = split[bench.Upstream](*eUpstreams)
	if ecfg.Clients, err = counts("-enforce-clients", *eClients); err != nil {
		return err
	}
	ecfg.Rounds, ecfg.Round, ecfg.Warmup, ecfg.Docs, ecfg.ProxyBinary = *eRounds, *eRound, *eWarmup, *eDocs, *eProxy
	ecfg.Progress = os.Stderr

	acfg := adef
	acfg.Upstreams = split[bench.Upstream](*aUpstreams)
	if acfg.Clients, err = counts("-audit-clients", *aClients); err != nil {
		return err
	}
	acfg.Rounds, acfg.Round, acfg.Dir = *aRounds, *aRound, *aDir
	acfg.Progress = os.Stderr

	lcfg := ldef
	if lcfg.Clients, err = counts("-locks-clients", *lClients); err != nil {
		return err
	}
	lcfg.Rounds, lcfg.Round, lcfg.Contenders, lcfg.Handoffs, lcfg.Poll = *lRounds, *lRound, *lContenders, *lHandoffs, *lPoll
	lo, hi, ok := strings.Cut(*lHold, ",")
	if lcfg.HoldMin, err = time.ParseDuration(strings.TrimSpace(lo)); err != nil || !ok {
		return fmt.Errorf("-locks-hold: want min,max durations, got %q", *lHold)
	}
	if lcfg.HoldMax, err = time.ParseDuration(strings.TrimSpace(hi)); err != nil {
		return fmt.Errorf("-locks-hold: want min,max durations, got %q", *lHold)
	}
	lcfg.Progress = os.Stderr

	hcfg := bench.DefaultHostileConfig()
	if *hShort {
		hcfg = bench.ShortHostileConfig()
	}
	if *hPhase > 0 {
		hcfg.Phase = *hPhase
	}
	for _, o := range []struct {
		flag int
		dst  *int
	}{{*hIdle, &hcfg.Idle}, {*hFlooders, &hcfg.Flooders}, {*hPipeliners, &hcfg.Pipeliners}, {*hGood, &hcfg.Good}} {
		if o.flag >= 0 {
			*o.dst = o.flag
		}
	}
	hcfg.Progress = os.Stderr

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	if *memprofile != "" {
		defer func() {
			f, err := os.Create(*memprofile)
			if err != nil {
				fmt.Fprintln(os.Stderr, "lockgate-bench:", err)
				return
			}
			defer f.Close()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintln(os.Stderr, "lockgate-bench:", err)
			}
		}()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	// Each family's tables are printed as soon as it is done.
	for _, f := range fams {
		switch f {
		case "proxy":
			rep, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			rep.WriteMarkdown(os.Stdout)
		case "enforce":
			rep, err := bench.RunEnforce(ctx, ecfg)
			if err != nil {
				return err
			}
			rep.WriteMarkdown(os.Stdout)
		case "legacy":
			rep, err := bench.RunLegacy(ctx, bench.DefaultLegacyConfig())
			if err != nil {
				return err
			}
			rep.WriteMarkdown(os.Stdout)
		case "audit":
			rep, err := bench.RunAudit(ctx, acfg)
			if err != nil {
				return err
			}
			rep.WriteMarkdown(os.Stdout)
		case "locks":
			rep, err := bench.RunLocks(ctx, lcfg)
			if err != nil {
				return err
			}
			rep.WriteMarkdown(os.Stdout)
		case "hostile":
			rep, err := bench.RunHostile(ctx, hcfg)
			if rep != nil {
				rep.WriteMarkdown(os.Stdout)
			}
			if err != nil {
				return err
			}
		}
		fmt.Println()
	}
	fmt.Fprintf(os.Stderr, "done in %v\n", time.Since(start).Round(time.Second))
	return nil
}

// counts parses a comma-separated list of positive numbers.
func counts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive number", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func join[T ~string](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = string(x)
	}
	return strings.Join(s, ",")
}

func split[T ~string](s string) []T {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, T(f))
		}
	}
	return out
}
