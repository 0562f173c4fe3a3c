package testkit

import "testing"

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
