package boundary

import (
	"os"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

func TestReservedTouches(t *testing.T) {
	r := ReservedFor("lockgate", "locks")
	for _, tt := range []struct {
		db, coll, cmd string
		want          bool
	}{
		{"lockgate", "locks", "find", true},
		{"lockgate", "locks_claims", "find", true},
		{"lockgate", "locks_txns", "find", true},
		{"lockgate", "locks_instances", "delete", true}, // emptied, a lockgate would think itself alone
		{"lockgate", "locks_wake", "find", true},        // wake addresses: forged ones would aim datagrams elsewhere
		{"LockGate", "LOCKS", "delete", true},
		{"lockgate", "ｌｏｃｋｓ", "find", true}, // full-width: NFKC folds it to "locks"
		{"lockgate", "", "dropDatabase", true},
		{"lockgate", "", "applyOps", true},
		{"*", "*", "applyOps", true},
		{"lockgate", "", "listCollections", false},
		{"lockgate", "", "ping", false},
		{"lockgate", "other", "find", false},
		{"shop", "locks", "find", false},
		{"lockgatex", "locks", "find", false},
	} {
		if got := r.touches(tt.db, tt.coll, tt.cmd); got != tt.want {
			t.Errorf("touches(%q, %q, %s) = %v, want %v", tt.db, tt.coll, tt.cmd, got, tt.want)
		}
	}
	if (Reserved{}).touches("lockgate", "locks", "find") {
		t.Error("a zero Reserved must seal nothing")
	}
}
