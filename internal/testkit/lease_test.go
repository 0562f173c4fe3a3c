package testkit

import (
	"strconv"
	"testing"
)

func TestScaleForLoad(t *testing.T) {
	for _, c := range []struct {
		load float64
		cpus int
		want int
	}{
		{0, 2, 1}, {1.9, 2, 1}, {2, 2, 1}, {2.1, 2, 2}, {9.5, 2, 5}, {100, 2, MaxLeaseScale}, {3, 0, 3},
	} {
		if got := scaleForLoad(c.load, c.cpus); got != c.want {
			t.Errorf("scaleForLoad(%v, %d) = %d, want %d", c.load, c.cpus, got, c.want)
		}
	}
}

func TestLeaseScaleEnv(t *testing.T) {
	t.Setenv(LeaseScaleEnv, "3")
	if n, _, err := LeaseScale(); n != 3 || err != nil {
		t.Errorf("LeaseScale with %s=3: %d, %v", LeaseScaleEnv, n, err)
	}
	for _, bad := range []string{"0", "9", "x", "1.5"} {
		t.Setenv(LeaseScaleEnv, bad)
		if _, _, err := LeaseScale(); err == nil {
			t.Errorf("LeaseScale with %s=%s: no error", LeaseScaleEnv, bad)
		}
	}
}

// TestLeaseScaleMin: the floor raises a lower reading of the load and
// leaves a higher one (MaxLeaseScale is above any idle machine's
// reading), and a bad floor is an error.
func TestLeaseScaleMin(t *testing.T) {
	t.Setenv(LeaseScaleEnv, "")
	t.Setenv(LeaseScaleMinEnv, "")
	base, _, err := LeaseScale()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(LeaseScaleMinEnv, strconv.Itoa(MaxLeaseScale))
	if n, why, err := LeaseScale(); n != MaxLeaseScale || err != nil {
		t.Errorf("LeaseScale with %s=%d: %d (%s), %v; without it %d", LeaseScaleMinEnv, MaxLeaseScale, n, why, err, base)
	}
	t.Setenv(LeaseScaleMinEnv, "1")
	if n, _, err := LeaseScale(); n < base || err != nil {
		t.Errorf("LeaseScale with %s=1: %d, %v; without it %d", LeaseScaleMinEnv, n, err, base)
	}
	t.Setenv(LeaseScaleMinEnv, "0")
	if _, _, err := LeaseScale(); err == nil {
		t.Errorf("LeaseScale with %s=0: no error", LeaseScaleMinEnv)
	}
	// The fixed scale wins over the floor.
	t.Setenv(LeaseScaleEnv, "1")
	t.Setenv(LeaseScaleMinEnv, "3")
	if n, _, err := LeaseScale(); n != 1 || err != nil {
		t.Errorf("LeaseScale with %s=1 and %s=3: %d, %v", LeaseScaleEnv, LeaseScaleMinEnv, n, err)
	}
}
