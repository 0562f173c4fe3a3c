package policy

import (
	"strings"
	"testing"

	"github.com/lockgate/lockgate/wire"
)

// TestWalksAgree: the two walks of a command, VisitReferences (the
// reserved-namespace boundary) and Classify (enforcement), must agree on
// where it writes: every namespace Classify finds a write on is one that
// VisitNamespaces reports, as that namespace, as its whole database, or as
// UnknownNS. A write the boundary walk missed would reach the lock store's
// collections past the boundary. Run over every classification case and
// over generated write commands.
func TestWalksAgree(t *testing.T) {
	check := func(t *testing.T, name string, raw []byte) {
		t.Helper()
		m := clParse(t, raw)
		cmd, err := wire.CommandOf(m)
		if err != nil || cmd == nil {
			return // legacy opcodes: the boundary reads their namespace itself
		}
		writes, err := Classify(m, cmd)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		VisitNamespaces(cmd, func(db, coll string) bool {
			seen[db+"."+coll] = true
			if coll == "" {
				seen[DBNamespace(db)] = true
			}
			return false
		})
		if seen[UnknownNS+"."+UnknownNS] {
			return
		}
		for _, w := range writes {
			if w.NS == NSAll {
				// Classify cannot tell (an applyOps command op); the
				// boundary walks the op's command itself.
				continue
			}
			db, _, _ := strings.Cut(w.NS, ".")
			if !seen[w.NS] && !seen[DBNamespace(db)] {
				t.Errorf("%s: Classify finds a write on %s that VisitNamespaces does not report (it saw %v)", name, w.NS, seen)
			}
		}
	}
	for _, tc := range classifyCases() {
		check(t, tc.name, tc.raw(t))
	}
	for seed := int64(0); seed < 200; seed++ {
		r := newRand(seed)
		c := genEditCase(t, r, true)
		check(t, "generated", c.raw)
	}
}
