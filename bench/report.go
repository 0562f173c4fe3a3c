package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// The targets of DESIGN §7, for the verdicts in the report.
const (
	TargetKept     = 0.95                  // lockgate keeps ≥ 95% of the relay's throughput
	TargetP50Added = 10 * time.Microsecond // lockgate adds ≤ 10 µs p50 over the relay
	TargetIdle     = 64 << 10              // an idle connection costs ≤ 64 KiB
)

// targetClients are the client counts the throughput and latency targets
// name.
var targetClients = []int{1, 16}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

// Line is a one-line summary of a cell, for progress output.
func (c *Cell) Line(legs []Leg) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %-9s c=%-2d", c.Upstream, c.Workload, c.Clients)
	for _, l := range legs {
		if s, ok := c.Median(l); ok {
			fmt.Fprintf(&b, " | %s %.0f op/s p50 %sµs p99 %sµs cpu %sµs/op", l, s.Throughput, us(s.P50), us(s.P99), us(s.CPUPerOp))
		}
	}
	if k, ok := c.Kept(Lockgate, Relayed); ok {
		a, _ := c.P50Added(Lockgate, Relayed)
		cpu, _ := c.CPUAdded(Lockgate, Relayed)
		fmt.Fprintf(&b, " | kept %.1f%% p50 %+.1fµs cpu %+.1fµs/op", 100*k.Median, a.Median/1e3, cpu.Median/1e3)
	}
	return b.String()
}

// WriteMarkdown writes the report as Markdown tables.
func (r *Report) WriteMarkdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Run %s, %s, GOMAXPROCS=%d (NumCPU=%d), %d rounds x %v per leg per cell, %v warm-up, %d documents; took %v.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.GOMAXPROCS, r.NumCPU, cfg.Rounds, cfg.Round, cfg.Warmup, cfg.Docs, r.Took.Round(time.Second))

	fmt.Fprintln(w, "| upstream | workload | clients | leg | ops/s | p50 µs | p99 µs | CPU µs/op | vs relay: throughput kept | vs relay: p50 added µs | vs relay: CPU added µs/op |")
	fmt.Fprintln(w, "|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		for _, l := range cfg.Legs {
			s, ok := c.Median(l)
			if !ok {
				continue
			}
			kept, added, cpu := "", "", ""
			if l != Relayed {
				if k, ok := c.Kept(l, Relayed); ok {
					kept = fmt.Sprintf("%.1f%%", 100*k.Median)
				}
				if a, ok := c.P50Added(l, Relayed); ok {
					added = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
				if a, ok := c.CPUAdded(l, Relayed); ok {
					cpu = fmt.Sprintf("%+.1f", a.Median/1e3)
				}
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n",
				c.Upstream, c.Workload, c.Clients, l, s.Throughput, us(s.P50), us(s.P99), us(s.CPUPerOp), kept, added, cpu)
		}
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Targets (DESIGN §7), lockgate vs relay: median of the per-round paired comparisons [interquartile range]. CPU-implied kept is relay CPU/op over lockgate CPU/op, the throughput ratio when the cores are the limit; it does not depend on how much CPU other processes left us.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| upstream | workload | clients | throughput kept (≥ 95%) | p50 added (≤ 10 µs) | CPU added per op | CPU-implied kept |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		if !slices.Contains(targetClients, c.Clients) {
			continue
		}
		k, ok1 := c.Kept(Lockgate, Relayed)
		a, ok2 := c.P50Added(Lockgate, Relayed)
		cpu, ok3 := c.CPUAdded(Lockgate, Relayed)
		ck, ok4 := c.CPUKept(Lockgate, Relayed)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.1f%% [%.0f–%.0f] %s | %+.1f µs [%+.1f–%+.1f] %s | %+.1f µs [%+.1f–%+.1f] | %.1f%% [%.0f–%.0f] |\n",
			c.Upstream, c.Workload, c.Clients,
			100*k.Median, 100*k.Q1, 100*k.Q3, verdict(k.Median >= TargetKept),
			a.Median/1e3, a.Q1/1e3, a.Q3/1e3, verdict(a.Median <= float64(TargetP50Added)),
			cpu.Median/1e3, cpu.Q1/1e3, cpu.Q3/1e3,
			100*ck.Median, 100*ck.Q1, 100*ck.Q3)
	}
	fmt.Fprintln(w)

	if m := r.Idle; m != nil {
		fmt.Fprintf(w, "Idle connections (%d per leg, instant upstream; HeapInuse+StackInuse of the whole process per connection):\n\n", m.Conns)
		fmt.Fprintln(w, "| leg | per connection | added over direct |")
		fmt.Fprintln(w, "|---|--:|--:|")
		for _, l := range cfg.Legs {
			v, ok := m.PerConn[l]
			if !ok {
				continue
			}
			added := ""
			if l != Direct {
				added = fmt.Sprintf("%.1f KiB", m.Added(l)/1024)
				if l == Lockgate {
					added += " " + verdict(m.Added(l) <= TargetIdle)
				}
			}
			fmt.Fprintf(w, "| %s | %.1f KiB | %s |\n", l, v/1024, added)
		}
		fmt.Fprintln(w)
	}
	for _, u := range cfg.Upstreams {
		if r.UpdatesVerified[u] {
			fmt.Fprintf(w, "%s: every acknowledged update is in the documents (sum of n checked).\n", u)
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "(meets)"
	}
	return "(**misses**)"
}
