package guard

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
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

// TestRoutineProbeRefusalLoggedAtDebug: mongosh sends getLog:
// "startupWarnings" on every connect; while a namespace is enforced it is
// refused at the boundary, which was logged at info, an alarming line per
// shell (issue 26). It is now at debug, still counted, while a getLog a
// person types ("global") stays at info.
func TestRoutineProbeRefusalLoggedAtDebug(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := startStackWith(t, stackOptions{logger: zap.New(core), policy: config.Policy{
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	c := connect(t, s.uri, "mongosh 2.3.0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, which := range []string{"startupWarnings", "global"} {
		if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "getLog", Value: which}}).Err(); err == nil || !strings.Contains(err.Error(), "allowSessionIntrospection") {
			t.Fatalf("getLog %s: %v, want the introspection refusal", which, err)
		}
	}
	refusals := logs.FilterMessage("refused a request across the proxy's boundary").All()
	if len(refusals) != 2 {
		t.Fatalf("%d boundary refusals logged, want 2", len(refusals))
	}
	for i, want := range []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel} {
		if refusals[i].Level != want {
			t.Errorf("refusal %d (%s) logged at %s, want %s", i, refusals[i].ContextMap()["error"], refusals[i].Level, want)
		}
	}
	if n := testutil.ToFloat64(s.metrics.reservedRefusals.WithLabelValues("session_introspection")); n != 2 {
		t.Errorf("lockgate_reserved_refusals_total{what=session_introspection} = %v, want 2 (the routine probe still counts)", n)
	}
}
