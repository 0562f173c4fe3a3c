package monitoring

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/lockgate/lockgate/gateway"
)

// exported is every metric a running lockgate can export, with its labels:
// what its registry describes (vectors included, observed or not), plus
// lockgate_build_info, which the binary registers.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	g := startGateway(t)
	if err := g.Registry().Register(gateway.BuildInfo("test")); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc)
	go func() { g.Registry().Describe(ch); close(ch) }()
	nameRE := regexp.MustCompile(`fqName: "([^"]+)"`)
	constRE := regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	varRE := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		m := nameRE.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("cannot read %s", s)
		}
		var labels []string
		if c := constRE.FindStringSubmatch(s); c != nil && c[1] != "" {
			for _, kv := range strings.Split(c[1], ",") {
				labels = append(labels, strings.SplitN(kv, "=", 2)[0])
			}
		}
		if v := varRE.FindStringSubmatch(s); v != nil && v[1] != "" {
			labels = append(labels, strings.Split(v[1], ",")...)
		}
		out[m[1]] = labels
	}
	return out
}

var (
	identRE    = regexp.MustCompile(`\b(lockgate_[a-z0-9_]+|go_[a-z0-9_]+|process_[a-z0-9_]+)\b(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRE = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// scrapeLabels are added by Prometheus, not by lockgate.
var scrapeLabels = []string{"instance", "job"}

// check returns what is wrong with one PromQL expression: metric names
// lockgate does not export, label names those metrics do not have.
func check(expr string, metrics map[string][]string) []string {
	var problems []string
	found := 0
	var all []string
	for _, m := range identRE.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		labels, ok := metrics[name]
		extra := []string(nil)
		if !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suffix); cut {
					if labels, ok = metrics[base]; ok {
						if suffix == "_bucket" {
							extra = []string{"le"}
						}
						break
					}
				}
			}
		}
		if !ok {
			problems = append(problems, "unknown metric "+name)
			continue
		}
		found++
		allowed := slices.Concat(labels, extra, scrapeLabels)
		all = append(all, allowed...)
		for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(allowed, lm[1]) {
				problems = append(problems, "metric "+name+" has no label "+lm[1])
			}
		}
	}
	if found == 0 && len(problems) == 0 {
		problems = append(problems, "names no lockgate metric")
	}
	for _, g := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(all, l) {
				problems = append(problems, "grouping by "+l+", which no metric of the expression has")
			}
		}
	}
	return problems
}

// assetQueries is every PromQL expression of the alert rules and the
// dashboard, with where it is.
func assetQueries(t *testing.T) (alerts, panels, variables map[string][]string) {
	t.Helper()
	alerts, panels, variables = map[string][]string{}, map[string][]string{}, map[string][]string{}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = append(alerts[r.Alert], r.Expr)
		}
	}
	b, err = os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			// Grafana's own variables are not PromQL.
			expr := strings.NewReplacer("$__rate_interval", "5m", `"$instance"`, `".*"`).Replace(q.Expr)
			panels[p.Title] = append(panels[p.Title], expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			variables[v.Name] = append(variables[v.Name], q["query"].(string))
		}
	}
	return alerts, panels, variables
}

func TestAssetsNameExportedMetrics(t *testing.T) {
	metrics := exported(t)
	if n := len(metrics); n < 30 {
		t.Fatalf("only %d metrics described; the registry is not the gateway's", n)
	}
	// The checker itself must catch what it is for.
	for _, bad := range []string{
		`rate(lockgate_decision_total[5m])`,
		`rate(lockgate_decisions_total{decison="reject"}[5m])`,
		`sum by (reasons) (rate(lockgate_decisions_total[5m]))`,
		`vector(1)`,
	} {
		if len(check(bad, metrics)) == 0 {
			t.Errorf("the checker accepts %q", bad)
		}
	}

	alerts, panels, variables := assetQueries(t)
	n := 0
	for alert, exprs := range alerts {
		for _, expr := range exprs {
			n++
			for _, p := range check(expr, metrics) {
				t.Errorf("alert %s: %s", alert, p)
			}
		}
	}
	if n < 5 {
		t.Errorf("alerts.yml has %d rules", n)
	}
	queries := 0
	for title, exprs := range panels {
		for _, expr := range exprs {
			queries++
			for _, pr := range check(expr, metrics) {
				t.Errorf("panel %q: %s", title, pr)
			}
		}
	}
	for name, exprs := range variables {
		for _, expr := range exprs {
			for _, pr := range check(expr, metrics) {
				t.Errorf("variable %s: %s", name, pr)
			}
		}
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries", queries)
	}
}
