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

// LeaseScaleMinEnv sets a floor under LeaseScale's reading of the load: a
// whole number from 1 to MaxLeaseScale. scripts/test.sh sets it for go
// test ./..., which starts its packages beside the race step: the load
// they read at their start is not the load they run under a minute
// later, once that step's packages and the other suites' clients run.
const LeaseScaleMinEnv = "LOCKGATE_TEST_LEASE_SCALE_MIN"

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
// at the package's start, and never goes under LOCKGATE_TEST_LEASE_SCALE_MIN
// where that is set; the reason is returned for the test log.
func LeaseScale() (int, string, error) {
	if s := os.Getenv(LeaseScaleEnv); s != "" {
		n, err := scaleEnv(LeaseScaleEnv, s)
		return n, LeaseScaleEnv + "=" + s, err
	}
	n, why, err := loadScale()
	if s := os.Getenv(LeaseScaleMinEnv); s != "" && err == nil {
		floor, err := scaleEnv(LeaseScaleMinEnv, s)
		if err != nil {
			return 0, "", err
		}
		if floor > n {
			return floor, why + ", raised to " + LeaseScaleMinEnv + "=" + s, nil
		}
	}
	return n, why, err
}

func scaleEnv(name, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxLeaseScale {
		return 0, fmt.Errorf("%s=%q: want a whole number from 1 to %d", name, s, MaxLeaseScale)
	}
	return n, nil
}

// loadScale is the scale for the machine's one-minute load average.
func loadScale() (int, string, error) {
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
