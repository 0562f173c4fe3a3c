package gateway

import (
	"embed"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
)

// The operator console: one static page, its script and its style sheet,
// with no external assets and no build step, plus one JSON view that
// gathers what the page shows. Force-release goes through the existing
// POST /locks/release, so the console adds no way to change state.
//
//go:embed console
var consoleFiles embed.FS

// consoleCSP allows only this origin's own script, style and fetches: the
// page shows client-chosen strings (application names, _id values), which
// the script only ever sets as text, and the policy forbids inline script
// as a second line of defence.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// consoleLock is one held lock as the console shows it. The token is a
// string: tokens use all 64 bits, past what a JavaScript number holds. So
// is the _id, twice: IDText to show (relaxed extended JSON, as written
// here, not as a JavaScript parser would rewrite it) and lockView.Key to
// send back to POST /locks/release. The page never parses either, so the
// row it shows and the lock it releases are the same one.
type consoleLock struct {
	lockView
	IDText      string `json:"idText"`
	Token       string `json:"token"`
	TimeLeftMS  int64  `json:"timeLeftMS"`
	LocalWaiter int    `json:"waiters"`
}

type consoleDecision struct {
	Rule     string  `json:"rule"`
	Decision string  `json:"decision"`
	Reason   string  `json:"reason"`
	Count    float64 `json:"count"`
}

func mountConsole(adm *admin.Server, store *lockstore.Store, pol func() *policy.Policy, reg *prometheus.Registry, actionsEnabled bool) {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.FileServerFS(sub)
	adm.Handle("/console/", http.StripPrefix("/console", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", consoleCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-store")
		files.ServeHTTP(w, r)
	})))
	adm.Handle("/console/state", admin.JSON(func(r *http.Request) (any, error) {
		now, _ := store.ServerNow()
		sts, err := store.List(r.Context(), lockstore.ListOptions{Limit: 500})
		if err != nil {
			return nil, err
		}
		locks := make([]consoleLock, len(sts))
		for i, st := range sts {
			locks[i] = consoleLock{lockView: viewOf(st), Token: strconv.FormatInt(st.Token, 10),
				TimeLeftMS: max(st.ExpiresAt.Sub(now).Milliseconds(), 0), LocalWaiter: store.Waiting(st.NS, st.ID)}
			if text, ok := extJSONText(st.ID.Raw(), false); ok && !st.ID.IsZero() {
				locks[i].IDText = text
			} else {
				locks[i].IDText = "<invalid>"
			}
		}
		out := map[string]any{"now": now.UTC().Format(time.RFC3339Nano), "locks": locks,
			"decisions": decisionCounts(reg), "actionsEnabled": actionsEnabled}
		if p := pol(); p != nil {
			rules, fallback := p.Rules()
			views := make([]ruleView, len(rules))
			for i, rl := range rules {
				views[i] = viewOfRule(rl)
			}
			out["policy"] = map[string]any{"version": p.Version(), "default": viewOfRule(fallback), "namespaces": views}
		}
		return out, nil
	}))
}

// decisionCounts reads lockgate_decisions_total from the registry, so the
// console shows the same numbers as /metrics.
func decisionCounts(reg *prometheus.Registry) []consoleDecision {
	mfs, err := reg.Gather()
	if err != nil && len(mfs) == 0 {
		return nil
	}
	var out []consoleDecision
	for _, mf := range mfs {
		if mf.GetName() != "lockgate_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			d := consoleDecision{Count: m.GetCounter().GetValue()}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					d.Rule = l.GetValue()
				case "decision":
					d.Decision = l.GetValue()
				case "reason":
					d.Reason = l.GetValue()
				}
			}
			out = append(out, d)
		}
	}
	return out
}
