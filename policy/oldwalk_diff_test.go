package policy

import (
	"maps"
	"slices"
	"testing"

	"github.com/lockgate/lockgate/wire"
)

// diffPlan compares the plan's named references with the old reference
// walk's visits, and its writes with the old walk's (Classify's).
func diffPlan(t *testing.T, name string, raw []byte) {
	m, err := wire.Parse(raw, wire.Limits{})
	if err != nil {
		return
	}
	cmd, err := wire.CommandOf(m)
	if err != nil || cmd == nil {
		return
	}
	old := map[string]bool{}
	oldVisitReferences(cmd, func(db, coll string) bool { old[db+"|"+coll] = true; return false }, nil)
	var oldStages []string
	oldVisitReferences(cmd, func(string, string) bool { return false }, func(s string) bool { oldStages = append(oldStages, s); return false })
	p := NewPlan(m, cmd)
	got := map[string]bool{}
	for _, r := range p.Refs() {
		if r.Access&Named != 0 {
			got[r.NS.DB()+"|"+r.NS.Collection()] = true
		}
	}
	if !maps.Equal(old, got) {
		t.Errorf("%s: plan refs %v, old walk %v", name, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(old)))
	}
	if !slices.Equal(oldStages, p.Stages()) {
		t.Errorf("%s: plan stages %v, old walk %v", name, p.Stages(), oldStages)
	}
}

func TestPlanAgainstOldWalk(t *testing.T) {
	for name, raw := range planCorpus(t) {
		diffPlan(t, name, raw)
	}
}

func FuzzPlanAgainstOldWalk(f *testing.F) {
	for _, raw := range planCorpus(f) {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { diffPlan(t, "fuzz", raw) })
}
