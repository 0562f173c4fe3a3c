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
	"github.com/lockgate/lockgate/namespace"
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
// row it shows and the lock it releases are the same one. Durations are
// measured here, on the lock store's clock, so that the page's own clock
// (another machine's) does not enter them.
type consoleLock struct {
	lockView
	IDText      string          `json:"idText"`
	Token       string          `json:"token"`
	TimeLeftMS  int64           `json:"timeLeftMS"`
	HeldForMS   int64           `json:"heldForMS"`
	Mirror      *consoleMirror  `json:"mirror"`
	LocalWaiter int             `json:"waiters"`
	WaiterList  []consoleWaiter `json:"waiting"`
}

// consoleMirror says that a lock mirrors the lock of an advisory locking
// scheme (docs/SCHEMES.md): the rule's and the scheme's names.
type consoleMirror struct {
	Rule   string `json:"rule"`
	Scheme string `json:"scheme"`
}

// consoleWaiter is one acquire queued on this instance for a lock.
type consoleWaiter struct {
	holderView
	Since     time.Time `json:"since"`
	WaitingMS int64     `json:"waitingMS"`
}

// consoleLocks bounds the locks one state lists.
const consoleLocks = 500

// mountConsole serves the page and GET /console/state. The decision
// rates it returns must be sampled (run) for the page to show any.
func mountConsole(adm *admin.Server, store *lockstore.Store, pol func() *policy.Policy, reg *prometheus.Registry, actionsEnabled, auditOn bool, now func() time.Time) *decisionRates {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	rates := newDecisionRates(now, func() map[rateKey]float64 { return decisionCounts(reg) })
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
		sts, err := store.List(r.Context(), lockstore.ListOptions{Limit: consoleLocks})
		if err != nil {
			return nil, err
		}
		p := pol()
		locks := make([]consoleLock, len(sts))
		for i, st := range sts {
			l := consoleLock{lockView: viewOf(st), Token: strconv.FormatInt(st.Token, 10),
				TimeLeftMS: max(st.ExpiresAt.Sub(now).Milliseconds(), 0), WaiterList: []consoleWaiter{}}
			if !st.Since.IsZero() {
				l.HeldForMS = max(now.Sub(st.Since).Milliseconds(), 0)
			}
			if text, ok := extJSONText(st.ID.Raw(), false); ok && !st.ID.IsZero() {
				l.IDText = text
			} else {
				l.IDText = "<invalid>"
			}
			for _, w := range store.Waiters(st.NS, st.ID) {
				l.WaiterList = append(l.WaiterList, consoleWaiter{
					holderView: holderView{App: w.App, Tag: w.SessionPrefix, Client: w.Client, User: w.User},
					Since:      w.Since, WaitingMS: max(now.Sub(w.Since).Milliseconds(), 0)})
			}
			l.LocalWaiter = len(l.WaiterList)
			if p != nil {
				l.Mirror = mirrorOf(p, st.NS)
			}
			locks[i] = l
		}
		// A sample now, so the current minute includes what the operator
		// just did; the sampler fills the minutes nobody looked at.
		rates.observe()
		out := map[string]any{"now": now.UTC().Format(time.RFC3339Nano), "locks": locks,
			"rates": rates.view(), "actionsEnabled": actionsEnabled, "audit": auditOn}
		if p != nil {
			rules, fallback := p.Rules()
			views := make([]ruleView, len(rules))
			for i, rl := range rules {
				views[i] = viewOfRule(rl)
			}
			out["policy"] = map[string]any{"version": p.Version(), "default": viewOfRule(fallback), "namespaces": views}
		}
		return out, nil
	}))
	return rates
}

// mirrorOf tells whether the locks of ns mirror a scheme's locks: the rule
// for ns has a scheme whose mirror lives in ns itself (for lockCollection,
// the lock collection's namespace, not the data's).
func mirrorOf(p *policy.Policy, ns namespace.Namespace) *consoleMirror {
	r := p.Lookup(ns)
	if !r.Scheme.Active() || r.Scheme.MirrorNS(ns).String() != ns.String() {
		return nil
	}
	return &consoleMirror{Rule: r.Match, Scheme: string(r.Scheme.Type)}
}

// decisionCounts reads lockgate_decisions_total from the registry, so the
// console shows the same numbers as /metrics.
func decisionCounts(reg *prometheus.Registry) map[rateKey]float64 {
	mfs, err := reg.Gather()
	if err != nil && len(mfs) == 0 {
		return nil
	}
	out := map[rateKey]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "lockgate_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var k rateKey
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					k.rule = l.GetValue()
				case "decision":
					k.decision = l.GetValue()
				case "reason":
					k.reason = l.GetValue()
				}
			}
			out[k] += m.GetCounter().GetValue()
		}
	}
	return out
}
