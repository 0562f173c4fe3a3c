package testkit

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// LeaseScaleEnv overrides LeaseScale: a whole number from 1 to
// MaxLeaseScale.
const LeaseScaleEnv = "LOCKGATE_TEST_LEASE_SCALE"

// MaxLeaseScale bounds LeaseScale, so that a machine far past its
// capacity gets slow tests, not endless ones.
const MaxLeaseScale = 8

// LeaseScale is the factor by which a test that runs real clients against
// real leases (tests/schemes) lengthens them: LOCKGATE_TEST_LEASE_SCALE
// when set, else the machine's one-minute load average per CPU, rounded
// up (1 on a machine with a core to spare). A lease that a loaded
// machine's pauses outlast makes such a test fail for the machine's sake:
// a holder's write arrives after its own lock ended. Scaled, the same
// test only waits longer for the expiries it tests. It reads the load once,
// at the package's start; the reason is returned for the test log.
func LeaseScale() (int, string, error) {
	if s := os.Getenv(LeaseScaleEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxLeaseScale {
			return 0, "", fmt.Errorf("%s=%q: want a whole number from 1 to %d", LeaseScaleEnv, s, MaxLeaseScale)
		}
		return n, LeaseScaleEnv + "=" + s, nil
	}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1, "no load average (" + err.Error() + ")", nil
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 1, "no load average", nil
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 1, "no load average", nil
	}
	return scaleForLoad(load, runtime.NumCPU()), fmt.Sprintf("load average %s on %d CPUs", f[0], runtime.NumCPU()), nil
}

func scaleForLoad(load float64, cpus int) int {
	n := int(math.Ceil(load / float64(max(cpus, 1))))
	return min(max(n, 1), MaxLeaseScale)
}
