package lockstore

import (
	"testing"

	"github.com/lockgate/lockgate/internal/metricset"
)

// TestMetricsAllCollected: every collector of Metrics is in its Set, so
// none is left out of what the registry gathers.
func TestMetricsAllCollected(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	if want := metricset.CollectorFields(m); len(m.Set) != want {
		t.Fatalf("%d collectors in the set, %d collector fields", len(m.Set), want)
	}
}
