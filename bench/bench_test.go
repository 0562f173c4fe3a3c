package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

func startStack(t testing.TB, u Upstream, docs int) *Stack {
	t.Helper()
	st, err := StartStack(u, docs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing the %s stack: %v", u, err)
		}
	})
	return st
}

func connect(t testing.TB, st *Stack, l Leg, collection string, maxPool int) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Connect(ctx, st, l, collection, maxPool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("disconnecting %s: %v", l, err)
		}
	})
	return c
}

// TestBenchSmoke runs every leg of every workload on both upstreams for a
// few hundred operations. Each operation checks its own answer (the found
// document is the one asked for, the update matched and modified one
// document) and the documents must hold exactly the increments the clients
// saw acknowledged. Nothing here is timed.
func TestBenchSmoke(t *testing.T) {
	const docs, ops, clients = 50, 300, 4
	for _, u := range AllUpstreams {
		t.Run(string(u), func(t *testing.T) {
			st := startStack(t, u, docs)
			coll := fmt.Sprintf("smoke_%d", time.Now().UnixNano())
			legs := make(map[Leg]*Client)
			for _, l := range AllLegs {
				legs[l] = connect(t, st, l, coll, clients)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := legs[Direct].Seed(ctx, docs); err != nil {
				t.Fatal(err)
			}
			rec := NewRecorder(clients, 1024)
			var updates int64
			for _, w := range AllWorkloads {
				for _, l := range AllLegs {
					r, err := legs[l].RunRound(ctx, w, clients, 0, ops, docs, rec, 1)
					if err != nil {
						t.Fatalf("%s %s: %v", l, w, err)
					}
					if r.Ops != ops {
						t.Errorf("%s %s: ran %d operations, want %d", l, w, r.Ops, ops)
					}
					if r.P50 <= 0 || r.P99 < r.P50 {
						t.Errorf("%s %s: percentiles p50 %v p99 %v", l, w, r.P50, r.P99)
					}
					updates += r.Updates
				}
			}
			if updates != int64(len(AllLegs))*ops {
				t.Errorf("%d updates acknowledged, want %d", updates, len(AllLegs)*ops)
			}
			// Every leg must see the same documents.
			for _, l := range AllLegs {
				sum, err := legs[l].SumN(ctx, docs)
				if err != nil {
					t.Fatalf("%s: %v", l, err)
				}
				if sum != updates {
					t.Errorf("%s: documents hold %d increments, want %d", l, sum, updates)
				}
			}
		})
	}
}

// TestRunReport runs the whole harness in miniature and checks that the
// report has every cell, ratio and the memory figure.
func TestRunReport(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Upstreams = []Upstream{InstantUpstream}
	cfg.Clients = []int{1, 2}
	cfg.Rounds = 2
	cfg.Round = 20 * time.Millisecond
	cfg.Warmup = 5 * time.Millisecond
	cfg.Docs = 20
	cfg.IdleConns = 10
	cfg.IdleRounds = 1
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Cells), len(cfg.Workloads)*len(cfg.Clients); got != want {
		t.Fatalf("%d cells, want %d", got, want)
	}
	for _, c := range rep.Cells {
		for _, l := range AllLegs {
			if len(c.Rounds[l]) != cfg.Rounds {
				t.Errorf("%s %s c=%d: %d rounds of %s, want %d", c.Upstream, c.Workload, c.Clients, len(c.Rounds[l]), l, cfg.Rounds)
			}
		}
		if _, ok := c.Kept(Lockgate, Relayed); !ok {
			t.Errorf("%s %s c=%d: no throughput ratio", c.Upstream, c.Workload, c.Clients)
		}
	}
	if rep.Idle == nil || len(rep.Idle.PerConn) != len(AllLegs) {
		t.Errorf("idle figure: %+v", rep.Idle)
	}
	if !rep.UpdatesVerified[InstantUpstream] {
		t.Error("updates not verified")
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	for _, want := range []string{"| instant | findOne | 1 | lockgate |", "| instant | updateOne | 2 | relay |", "throughput kept", "CPU-implied kept", "added over direct"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestPercentile(t *testing.T) {
	s := make([]int64, 100)
	for i := range s {
		s[i] = int64(100 - i) // 100..1, unsorted
	}
	if got := percentile(s, 50); got != 50 {
		t.Errorf("p50 = %d, want 50", got)
	}
	if got := percentile(s, 99); got != 99 {
		t.Errorf("p99 = %d, want 99", got)
	}
	if got := percentile([]int64{7}, 99); got != 7 {
		t.Errorf("p99 of one = %d, want 7", got)
	}
	if got := median([]float64{3, 1, 2, 10}); got != 2.5 {
		t.Errorf("median = %v, want 2.5", got)
	}
	if q1, q3 := quartiles([]float64{5, 1, 4, 2, 3}); q1 != 2 || q3 != 4 {
		t.Errorf("quartiles = %v, %v, want 2, 4", q1, q3)
	}
}

// BenchmarkLegs is the go test form of the same measurement, one
// sub-benchmark per upstream, workload, client count and leg, for
// -cpuprofile and benchstat. It does not interleave the legs; the command
// (go run ./bench/cmd/lockgate-bench) does, and is what the docs report.
func BenchmarkLegs(b *testing.B) {
	const docs = 1000
	for _, u := range AllUpstreams {
		b.Run("upstream="+string(u), func(b *testing.B) {
			st := startStack(b, u, docs)
			coll := fmt.Sprintf("bench_%d", time.Now().UnixNano())
			legs := make(map[Leg]*Client)
			for _, l := range AllLegs {
				legs[l] = connect(b, st, l, coll, 32)
			}
			if err := legs[Direct].Seed(context.Background(), docs); err != nil {
				b.Fatal(err)
			}
			rec := NewRecorder(32, 1<<16)
			for _, w := range AllWorkloads {
				for _, n := range []int{1, 16, 32} {
					for _, l := range AllLegs {
						b.Run(fmt.Sprintf("%s/clients=%d/leg=%s", w, n, l), func(b *testing.B) {
							r, err := legs[l].RunRound(context.Background(), w, n, 0, int64(b.N), docs, rec, uint64(b.N))
							if err != nil {
								b.Fatal(err)
							}
							b.ReportMetric(float64(r.P50.Nanoseconds()), "p50-ns")
							b.ReportMetric(float64(r.P99.Nanoseconds()), "p99-ns")
							b.ReportMetric(r.Throughput(), "ops/s")
						})
					}
				}
			}
		})
	}
}

// TestEnforceSmoke runs the enforcement benchmark in miniature on both
// upstreams: the gateway must refuse an update without the lock, apply
// every update under the locks (each one checked, and the sums of n), and
// count the lock store's round trips. Nothing here is timed.
func TestEnforceSmoke(t *testing.T) {
	cfg := DefaultEnforceConfig()
	cfg.Clients = []int{1, 3}
	cfg.Rounds = 1
	cfg.Round = 50 * time.Millisecond
	cfg.Warmup = 0
	cfg.Docs = 6
	rep, err := RunEnforce(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Cells), len(cfg.Upstreams)*len(cfg.Clients); got != want {
		t.Fatalf("%d cells, want %d", got, want)
	}
	for _, c := range rep.Cells {
		for _, l := range EnforceLegs {
			if c.Writes(l) == 0 {
				t.Errorf("%s c=%d: leg %s made no writes", c.Upstream, c.Clients, l)
			}
		}
		if _, ok := c.Kept(Enforced, Unprotected); !ok {
			t.Errorf("%s c=%d: no ratio", c.Upstream, c.Clients)
		}
	}
	for _, u := range cfg.Upstreams {
		if !strings.Contains(rep.Checked[u], "refused with LockBusy") {
			t.Errorf("%s: not checked: %q", u, rep.Checked[u])
		}
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	for _, want := range []string{"| instant | 3 | enforced |", "| ferretdb | 1 | unprotected |", "round trips per enforced write"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	t.Log("\n" + b.String())
}

// TestLockSmoke runs the lock benchmark in miniature: every cycle checks
// that the lock was granted with a higher fencing token and released; the
// contended leg checks that no two clients ever held the key at once; every
// handoff checks that the waiter got the lock after the release. Nothing
// here is timed.
func TestLockSmoke(t *testing.T) {
	cfg := DefaultLockConfig()
	cfg.Rounds = 1
	cfg.Round = 100 * time.Millisecond
	cfg.Warmup = 0
	cfg.Clients = []int{1, 2}
	cfg.Contenders = 3
	cfg.Handoffs = 2
	cfg.HoldMin, cfg.HoldMax = 20*time.Millisecond, 40*time.Millisecond
	cfg.Poll = 20 * time.Millisecond
	rep, err := RunLocks(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Legs {
		if opsOf(rep.Throughput, l) == 0 {
			t.Errorf("%s: no cycles", l)
		}
	}
	if rep.Grants == 0 {
		t.Error("contended leg: no grants")
	}
	if len(rep.Handoffs) != len(HandoffSetups) {
		t.Fatalf("%d handoff setups, want %d", len(rep.Handoffs), len(HandoffSetups))
	}
	for _, h := range rep.Handoffs {
		if got, want := len(h.FromAck), cfg.Rounds*cfg.Handoffs; got != want {
			t.Errorf("%s: %d handoffs, want %d", h.Setup.Name, got, want)
		}
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	for _, want := range []string{"| one proxy, waitMS |", "two proxies, retry every 100 ms (baseline)", "contended, 3 clients"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	t.Log("\n" + b.String())
}

// TestAuditSmoke runs the audit family in miniature: on both upstreams
// every leg writes, the trails verify and hold a record for every
// acknowledged write (RunAudit fails otherwise), and the report has its
// rows.
func TestAuditSmoke(t *testing.T) {
	cfg := DefaultAuditConfig()
	cfg.Clients = []int{3}
	cfg.Rounds = 1
	cfg.Round = 50 * time.Millisecond
	cfg.Warmup = 0
	cfg.Docs = 6
	cfg.Dir = t.TempDir()
	rep, err := RunAudit(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Cells), len(cfg.Upstreams); got != want {
		t.Fatalf("%d cells, want %d", got, want)
	}
	for _, c := range rep.Cells {
		for _, l := range AuditLegs {
			if s, ok := c.Median(l); !ok || s.Throughput == 0 {
				t.Errorf("%s: leg %s made no writes", c.Upstream, l)
			}
		}
	}
	for _, u := range cfg.Upstreams {
		if !strings.Contains(rep.Checked[u], "both trails verify") {
			t.Errorf("%s: not checked: %q", u, rep.Checked[u])
		}
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	for _, want := range []string{"| instant | 3 | bestEffort |", "| ferretdb | 3 | required |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	t.Log("\n" + b.String())
}
