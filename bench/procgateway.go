package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// gatewayUnderTest is what the enforce family needs of lockgate, whether
// it runs in the benchmark's process (Gateway) or in its own
// (procGateway).
type gatewayUnderTest interface {
	Addr() string
	RoundTrips() (map[string]float64, error)
	Close() error
}

// procGateway is lockgate as a sidecar runs it: the proxy binary in a
// process of its own, so that the clients' driver and the upstream do not
// share its Go runtime, its scheduler or the order in which its goroutines
// run. Configured as StartGateway configures the in-process one, through
// the LOCKGATE_* environment (docs/CONFIGURATION.md); its logs go to
// /dev/null, through the same production logger.
type procGateway struct {
	cmd         *exec.Cmd
	addr, admin string
	exited      chan error
}

// startProcGateway starts bin (a lockgate build) in front of upstreamURI
// with the namespaces in enforce mode, and waits for /readyz.
func startProcGateway(bin, upstreamURI, lockstoreURI string, enforce ...string) (*procGateway, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, ns := range enforce {
		rules = append(rules, fmt.Sprintf("{match: %q, mode: enforce}", ns))
	}
	lease := strconv.FormatInt(benchLease.Milliseconds(), 10)
	g := &procGateway{addr: ports[0], admin: ports[1], exited: make(chan error, 1)}
	g.cmd = exec.Command(bin)
	g.cmd.Env = append(os.Environ(),
		"LOCKGATE_LISTEN="+g.addr, "LOCKGATE_ADMIN="+g.admin,
		"LOCKGATE_UPSTREAM_URI="+upstreamURI, "LOCKGATE_UPSTREAM_DIAL_TIMEOUT=5s",
		"LOCKGATE_LOCKSTORE_URI="+lockstoreURI,
		"LOCKGATE_LOCKSTORE_MAX_LEASE_MS="+lease, "LOCKGATE_LOCKSTORE_DEFAULT_LEASE_MS="+lease,
		"LOCKGATE_POLICY_NAMESPACES=["+strings.Join(rules, ", ")+"]",
		"LOCKGATE_SHUTDOWN_TIMEOUT=5s")
	// Stdout and stderr stay nil: /dev/null.
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", bin, err)
	}
	go func() { g.exited <- g.cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-g.exited:
			return nil, fmt.Errorf("bench: %s exited before it was ready: %v", bin, err)
		case <-time.After(50 * time.Millisecond):
		}
		if ready(g.admin) {
			return g, nil
		}
		if time.Now().After(deadline) {
			_ = g.Close()
			return nil, fmt.Errorf("bench: %s was not ready on %s within 30s", bin, g.admin)
		}
	}
}

// cpuClock is the CPU clock of a round through gw: this process's, and
// gw's process's when lockgate runs in its own.
func cpuClock(gw gatewayUnderTest) func() time.Duration {
	if pg, ok := gw.(*procGateway); ok {
		return func() time.Duration { return processCPU() + pg.CPU() }
	}
	return processCPU
}

// freePorts finds n loopback ports free at the time of the call.
func freePorts(n int) ([]string, error) {
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		out = append(out, ln.Addr().String())
	}
	return out, nil
}

// ready tells whether the admin listener at addr answers /readyz with 200.
func ready(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (g *procGateway) Addr() string { return g.addr }

// CPU is the time the process's threads have run so far, summed from
// their schedstat (nanoseconds; /proc/PID/stat counts in clock ticks, 10
// ms, too coarse for a round of 300 ms). A thread that has exited is no
// longer counted; Go's runtime keeps its threads.
func (g *procGateway) CPU() time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", g.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	return sum
}

// RoundTrips reads lockgate_lockstore_round_trips_total from the
// process's /metrics, by operation (outcomes summed).
func (g *procGateway) RoundTrips() (map[string]float64, error) {
	resp, err := http.Get("http://" + g.admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("bench: the gateway's /metrics: %w", err)
	}
	return roundTripsOf(mfs["lockgate_lockstore_round_trips_total"]), nil
}

// roundTripsOf sums a round-trip counter family's values by their op label.
func roundTripsOf(mf *dto.MetricFamily) map[string]float64 {
	out := make(map[string]float64)
	for _, m := range mf.GetMetric() {
		op := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "op" {
				op = lp.GetValue()
			}
		}
		out[op] += m.GetCounter().GetValue()
	}
	return out
}

// Close stops the process as an orchestrator does (SIGTERM) and waits for
// it; a process still running after 15 s is killed.
func (g *procGateway) Close() error {
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	select {
	case err := <-g.exited:
		return err
	case <-ctx.Done():
		_ = g.cmd.Process.Kill()
		<-g.exited
		return errors.New("bench: the gateway process did not stop within 15s of SIGTERM")
	}
}
