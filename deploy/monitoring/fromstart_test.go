package monitoring

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// series is one scrape: every label set of every family, each label set
// rendered as sorted name="value" pairs (le and quantile left out, so a
// histogram is one series per label set, like a counter).
type series map[string]map[string]map[string]string

// startGateway starts a lockgate in front of an embedded FerretDB for the
// test, with an enforced and an audited rule: the decision series of both
// modes (reject and would_reject) are among those the assets select.
func startGateway(t *testing.T) *gatewaytest.Gateway {
	t.Helper()
	up, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	cfg := gatewaytest.Config(up.URI())
	cfg.Policy.Namespaces = []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce},
		{Match: "shop.*", Mode: config.ModeAudit},
	}
	return gatewaytest.Start(t, cfg, nil)
}

// scrape reads the admin server's /metrics as Prometheus would.
func scrape(t *testing.T, g *gatewaytest.Gateway) series {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics = %d: %s", resp.StatusCode, b)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	out := series{}
	for name, f := range fams {
		out[name] = map[string]map[string]string{}
		for _, m := range f.GetMetric() {
			labels := labelMap(m)
			out[name][labelKey(labels)] = labels
		}
	}
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		if l.GetName() != "le" && l.GetName() != "quantile" {
			labels[l.GetName()] = l.GetValue()
		}
	}
	return labels
}

func labelKey(labels map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		kv = append(kv, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	return "{" + strings.Join(kv, ",") + "}"
}

// family is the family a series name of a query belongs to: a histogram's
// _bucket, _sum and _count are its own.
func (s series) family(name string) string {
	if _, ok := s[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(name, suffix); cut {
			if _, ok := s[base]; ok {
				return base
			}
		}
	}
	return name
}

// has reports whether a series of family has every label of want.
func (s series) has(family string, want map[string]string) bool {
	for _, labels := range s[family] {
		ok := true
		for k, v := range want {
			if labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

var (
	labelMatcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	alternativesRE = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)
)

// selector is one series selector of a query: a metric name and the label
// sets it must find, one per combination of the values its = and =~
// matchers name (a =~ of plain alternatives names each of them).
type selector struct {
	name string
	want []map[string]string
}

func selectors(expr string) []selector {
	var out []selector
	for _, m := range identRE.FindAllStringSubmatch(expr, -1) {
		sel := selector{name: m[1], want: []map[string]string{{}}}
		for _, lm := range labelMatcherRE.FindAllStringSubmatch(m[2], -1) {
			label, op, value := lm[1], lm[2], lm[3]
			var values []string
			switch {
			case slices.Contains(scrapeLabels, label):
			case op == "=":
				values = []string{value}
			case op == "=~" && alternativesRE.MatchString(value):
				values = strings.Split(value, "|")
			}
			if values == nil {
				continue
			}
			var next []map[string]string
			for _, w := range sel.want {
				for _, v := range values {
					c := maps.Clone(w)
					c[label] = v
					next = append(next, c)
				}
			}
			sel.want = next
		}
		out = append(out, sel)
	}
	return out
}

// TestAssetsSeriesExistBeforeTraffic: a counter vector has no series until
// its first event, so a panel over lockgate_policy_reloads_total showed "no
// data", and an alert on increase() or rate() of a series cannot see the
// event that creates it: the first refused reload, the first reserved
// refusal, the first failed lock store round trip went unnoticed (issue
// 25). Every series an alert, a panel or a dashboard variable selects is
// on /metrics, at zero, before any traffic; and traffic that refuses,
// renews, releases and probes adds no new label set to any of those
// metrics, which shows that the known label sets are all there from the
// start.
func TestAssetsSeriesExistBeforeTraffic(t *testing.T) {
	g := startGateway(t)

	atStart := scrape(t, g)
	if n := len(atStart["lockgate_client_connections_total"]); n != 1 {
		t.Fatalf("lockgate_client_connections_total has %d series: not the gateway's /metrics", n)
	}
	alerts, panels, variables := assetQueries(t)
	named := map[string]bool{}
	checked := 0
	for kind, m := range map[string]map[string][]string{"alert": alerts, "panel": panels, "variable": variables} {
		for where, exprs := range m {
			for _, expr := range exprs {
				for _, sel := range selectors(expr) {
					// lockgate_build_info is the binary's, not the
					// gateway's (cmd/proxy TestDrainDelayAndVersionMetric).
					if !strings.HasPrefix(sel.name, "lockgate_") || sel.name == "lockgate_build_info" {
						continue
					}
					fam := atStart.family(sel.name)
					named[fam] = true
					for _, want := range sel.want {
						checked++
						if !atStart.has(fam, want) {
							t.Errorf("%s %q selects %s%s, which has no series before traffic", kind, where, sel.name, labelKey(want))
						}
					}
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked %d selectors: the assets were not read", checked)
	}

	traffic(t, g)

	after := scrape(t, g)
	if !after.has("lockgate_lock_commands_total", map[string]string{"command": "acquireLock", "result": "ok"}) {
		t.Fatal("no lock command was counted: the traffic did not reach the gateway")
	}
	for _, fam := range slices.Sorted(maps.Keys(named)) {
		var appeared []string
		for key := range after[fam] {
			if _, ok := atStart[fam][key]; !ok {
				appeared = append(appeared, key)
			}
		}
		sort.Strings(appeared)
		for _, key := range appeared {
			t.Errorf("%s%s first appeared with traffic: rate() and increase() miss the event that created it", fam, key)
		}
	}
}

// traffic drives what a day of service does to the series the assets
// select: lock commands that succeed and are refused (held, not holder,
// bad argument), refused and audited writes, a request for the lock
// store's own collection, and ended sessions.
func traffic(t *testing.T, g *gatewaytest.Gateway) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(g.URI).SetAppName("monitoring-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	shop := c.Database("shop")
	a, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer a.EndSession(ctx)
	b, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer b.EndSession(ctx)
	actx, bctx := mongo.NewSessionContext(ctx, a), mongo.NewSessionContext(ctx, b)
	run := func(sctx context.Context, cmd bson.D, wantOK bool) {
		t.Helper()
		err := shop.RunCommand(sctx, cmd).Err()
		if (err == nil) != wantOK {
			t.Fatalf("%v: %v (want ok: %v)", cmd, err, wantOK)
		}
	}
	run(actx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}}, true)
	run(bctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}}, false)
	run(bctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}, {Key: "waitMS", Value: 1}}, false)
	run(bctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: "not an array"}}, false)
	run(actx, bson.D{{Key: "renewLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}}, true)
	run(bctx, bson.D{{Key: "renewLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}}, false)
	run(actx, bson.D{{Key: "lockStatus", Value: "orders"}, {Key: "ids", Value: bson.A{1, 2}}}, true)
	if _, err := shop.Collection("orders").UpdateOne(actx, bson.M{"_id": 1}, bson.M{"$set": bson.M{"n": 1}}, options.Update().SetUpsert(true)); err != nil {
		t.Fatalf("a write under the lock: %v", err)
	}
	if _, err := shop.Collection("orders").UpdateOne(bctx, bson.M{"_id": 1}, bson.M{"$set": bson.M{"n": 2}}); err == nil {
		t.Fatal("a write without the lock was let through")
	}
	if _, err := shop.Collection("carts").UpdateOne(bctx, bson.M{"_id": 1}, bson.M{"$set": bson.M{"n": 2}}, options.Update().SetUpsert(true)); err != nil {
		t.Fatalf("an audited write: %v", err)
	}
	if err := c.Database(config.Default().Lockstore.Database).Collection(config.Default().Lockstore.Collection).FindOne(ctx, bson.D{}).Err(); err == nil {
		t.Fatal("a read of the lock store's collection was let through")
	}
	run(actx, bson.D{{Key: "releaseLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}}, true)
}
