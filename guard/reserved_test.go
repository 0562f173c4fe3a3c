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

// TestRoutineProbeRefusalLoggedAtDebug: mongosh sends getLog:
// "startupWarnings" on every connect; while a namespace is enforced it is
// refused at the boundary, which was logged at info, an alarming line per
// shell (issue 26). It is now at debug, still counted, while a getLog a
// person types ("global") stays at info.
func TestRoutineProbeRefusalLoggedAtDebug(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := startStackWith(t, stackOptions{memStore: decisionStore(), logger: zap.New(core), policy: config.Policy{
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
