package policy

import (
	"strconv"
	"testing"

	"github.com/lockgate/lockgate/wire"
)

// planCorpus is every message the policy tests build: the classification
// cases, the command table with a collection name as first value,
// generated write commands (the edit generator's) and aggregates whose
// stage specs nest (pipelineCases).
func planCorpus(t testing.TB) map[string][]byte {
	c := map[string][]byte{}
	for _, tc := range classifyCases() {
		c["classify/"+tc.name] = tc.raw(t)
	}
	for _, s := range wire.Commands() {
		for _, first := range []any{"orders", "system.indexes", "lockgate.locks", int32(1)} {
			c["table/"+s.Name+"/"+typeName(first)] = clMsgRaw(t, 0, D{{s.Name, first}, {"$db", "shop"}})
		}
	}
	for seed := int64(0); seed < 200; seed++ {
		r := newRand(seed)
		c["generated/"+strconv.FormatInt(seed, 10)] = genEditCase(t, r, true).raw
	}
	for name, raw := range pipelineCases(t) {
		c[name] = raw
	}
	return c
}

func typeName(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return "int"
}

// checkPlan: the plan's writes are Classify's, and they land only on
// namespaces its references hold (the boundary reads those), each marked
// Written.
func checkPlan(t *testing.T, name string, raw []byte) {
	m, err := wire.Parse(raw, wire.Limits{})
	if err != nil {
		return
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		return
	}
	p := NewPlan(m, cmd)
	writes, err := p.Writes()
	want, wantErr := Classify(m, cmd)
	if len(writes) != len(want) || (err == nil) != (wantErr == nil) {
		t.Errorf("%s: plan has %d writes, %v; Classify %d, %v", name, len(writes), err, len(want), wantErr)
	}
	for _, w := range writes {
		n := writeNamespace(w.NS)
		found := false
		for _, r := range p.Refs() {
			found = found || (r.NS == n && r.Access&Written != 0)
		}
		if !found {
			t.Errorf("%s: write on %s is not among the plan's references %v", name, w.NS, p.Refs())
		}
	}
}

func TestPlanWritesAreReferences(t *testing.T) {
	for name, raw := range planCorpus(t) {
		checkPlan(t, name, raw)
	}
}

func FuzzPlan(f *testing.F) {
	for _, raw := range planCorpus(f) {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkPlan(t, "fuzz", raw) })
}
