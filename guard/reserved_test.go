package guard

import (
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
)

func TestReservedTouches(t *testing.T) {
	r := ReservedFor("lockgate", "locks")
	for _, tt := range []struct {
		db, coll, cmd string
		want          bool
	}{
		{"lockgate", "locks", "find", true},
		{"lockgate", "locks_claims", "find", true},
		{"lockgate", "locks_txns", "find", true},
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

// TestLeaseEndNeverPrintsZeroTime: a refusal for an absent or released
// lease used to say "until 1970-01-01" (issue 12).
func TestLeaseEndNeverPrintsZeroTime(t *testing.T) {
	for _, tm := range []time.Time{{}, time.Unix(0, 0)} {
		if s := leaseEnd(tm); strings.Contains(s, "1970") || strings.Contains(s, "0001") {
			t.Errorf("leaseEnd(%v) = %q", tm, s)
		}
	}
	if s := leaseEnd(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)); s != "until 2030-01-02T03:04:05Z" {
		t.Errorf("leaseEnd of a real lease = %q", s)
	}
	he := &lockstore.HeldError{NS: "a.b", ID: lockstoretest.ID(int32(1)), Timeout: true}
	if s := he.Error(); strings.Contains(s, "1970") || strings.Contains(s, "0001") {
		t.Errorf("HeldError without a lease: %q", s)
	}
}
