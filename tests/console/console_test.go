package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

const chromiumPath = "/usr/bin/chromium"

// The console shows a lock that a test client holds, refuses to
// force-release it without the admin token (and with a wrong one), and
// releases it with the token and a reason.
func TestConsoleShowsAndForceReleasesALock(t *testing.T) {
	g, adminToken := startConsole(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A client whose application name is markup: the console must show it
	// as text.
	const app = `console<b id="injected">client</b>`
	c, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName(app))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	sess, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(context.Background())
	sc := mongo.NewSessionContext(ctx, sess)
	db := c.Database("kit")
	var acq struct {
		Locks []struct {
			Token int64 `bson:"token"`
		} `bson:"locks"`
	}
	if err := db.RunCommand(sc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&acq); err != nil {
		t.Fatal(err)
	}
	tok := acq.Locks[0].Token
	// A refused write, so that the decision counts have something to show.
	if _, err := db.Collection("orders").UpdateOne(ctx, bson.M{"_id": 42}, bson.M{"$set": bson.M{"x": 1}}); err == nil {
		t.Fatal("a write without the lock was allowed")
	}
	held := func() bool {
		var st struct {
			Locks []struct {
				HeldByYou bool `bson:"heldByYou"`
			} `bson:"locks"`
		}
		if err := db.RunCommand(sc, bson.D{{Key: "lockStatus", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st.Locks[0].HeldByYou
	}

	// The page is served with a policy that forbids inline and foreign
	// script, and tokens travel as strings (64-bit, past JavaScript's
	// exact integers).
	resp, err := http.Get("http://" + g.AdminAddr().String() + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	resp, err = http.Get("http://" + g.AdminAddr().String() + "/console/state")
	if err != nil {
		t.Fatal(err)
	}
	var state struct {
		Locks []struct {
			Token json.RawMessage `json:"token"`
		} `json:"locks"`
	}
	json.NewDecoder(resp.Body).Decode(&state)
	resp.Body.Close()
	if len(state.Locks) != 1 || string(state.Locks[0].Token) != fmt.Sprintf("%q", fmt.Sprint(tok)) {
		t.Errorf("/console/state locks = %+v, want one with token \"%d\"", state.Locks, tok)
	}

	bctx, stop := browser(t, ctx)
	defer stop()
	url := "http://" + g.AdminAddr().String() + "/console/"
	row := `#locks tr[data-namespace="kit.orders"][data-id="42"]`
	var cells []string
	var policyText, decisionsText string
	var injected bool
	if err := chromedp.Run(bctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(row, chromedp.ByQuery),
		chromedp.Evaluate(`Array.from(document.querySelectorAll('`+row+` td')).map(td => td.textContent)`, &cells),
		chromedp.Text(`#policy tbody`, &policyText, chromedp.ByQuery),
		chromedp.Evaluate(`document.getElementById('injected') !== null`, &injected),
	); err != nil {
		t.Fatalf("loading the console: %v", err)
	}
	if len(cells) < 12 || cells[0] != "kit.orders" || cells[1] != "42" || cells[3] != app || cells[7] != fmt.Sprint(tok) || !strings.HasSuffix(cells[9], "s") || cells[10] != "0" {
		t.Fatalf("lock row = %q; want kit.orders, 42, holder %q, token %d, time left, 0 waiters", cells, app, tok)
	}
	if injected {
		t.Fatal("the application name was rendered as markup")
	}
	if !strings.Contains(policyText, "kit.*") || !strings.Contains(policyText, "enforce") {
		t.Errorf("policy table = %q", policyText)
	}
	if err := chromedp.Run(bctx, chromedp.Poll(`document.querySelector('#decisions tbody').textContent.includes('reject')`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text(`#decisions tbody`, &decisionsText, chromedp.ByQuery)); err != nil {
		t.Errorf("decision counts do not show the refused write: %v (%q)", err, decisionsText)
	}

	release := func(token, reason string) string {
		t.Helper()
		var result string
		if err := chromedp.Run(bctx,
			chromedp.Evaluate(`document.getElementById('token').value = `+jsString(token), nil),
			chromedp.Evaluate(`document.getElementById('result').textContent = ''`, nil),
			// Found and clicked in one step in the page: the console
			// re-renders the table on every refresh, so a node looked
			// up first may be gone by the time it is clicked.
			chromedp.Evaluate(`document.querySelector(`+jsString(row+` button.release`)+`).click()`, nil),
			chromedp.WaitVisible(`#release-dialog`, chromedp.ByQuery),
			chromedp.SendKeys(`#reason`, reason, chromedp.ByQuery),
			chromedp.Click(`#release-confirm`, chromedp.ByQuery),
			chromedp.Poll(`document.getElementById('result').textContent`, &result, chromedp.WithPollingTimeout(10*time.Second)),
		); err != nil {
			t.Fatalf("force-release through the console: %v", err)
		}
		return result
	}
	if got := release("", "stuck batch job"); !strings.Contains(got, "refused") {
		t.Fatalf("without the token: %q, want refused", got)
	}
	if !held() {
		t.Fatal("the lock was released without the admin token")
	}
	if got := release("wrong-token", "stuck batch job"); !strings.Contains(got, "refused") {
		t.Fatalf("with a wrong token: %q, want refused", got)
	}
	if !held() {
		t.Fatal("the lock was released with a wrong admin token")
	}
	if got := release(adminToken, "stuck batch job"); !strings.HasPrefix(got, "released kit.orders") || !strings.Contains(got, app) {
		t.Fatalf("with the token: %q, want released", got)
	}
	if held() {
		t.Fatal("the console said released, but the client still holds the lock")
	}
	// The row goes away on the next refresh.
	if err := chromedp.Run(bctx, chromedp.WaitNotPresent(row, chromedp.ByQuery)); err != nil {
		t.Fatalf("the released lock is still listed: %v", err)
	}
}

// Force-release releases the lock of the row clicked, whatever its _id
// (issue 27, item 5). A victim holds {"1": "x", "a": "y"} and an attacker
// {"a": "y", "1": "x"}, another _id: a page that parses the ids and sends
// them back rebuilt shows both as the victim's and releases the victim's
// lock from the attacker's row, raising its token. An int64 _id past 2^53
// (a snowflake id) is rounded by such a page and cannot be released.
func TestConsoleForceReleasesExactlyTheRowsLock(t *testing.T) {
	g, adminToken := startConsole(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	type holder struct {
		app string
		sc  context.Context
		db  *mongo.Database
		id  any
	}
	hold := func(app string, id any) *holder {
		t.Helper()
		c, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName(app))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Disconnect(context.Background()) })
		sess, err := c.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.EndSession(context.Background()) })
		h := &holder{app: app, sc: mongo.NewSessionContext(ctx, sess), db: c.Database("kit"), id: id}
		if err := h.db.RunCommand(h.sc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{id}}}).Err(); err != nil {
			t.Fatalf("%s's acquireLock: %v", app, err)
		}
		return h
	}
	// status is whether h still holds its lock, and the lock's token.
	status := func(h *holder) (bool, int64) {
		t.Helper()
		var st struct {
			Locks []struct {
				HeldByYou bool  `bson:"heldByYou"`
				Token     int64 `bson:"token"`
			} `bson:"locks"`
		}
		if err := h.db.RunCommand(h.sc, bson.D{{Key: "lockStatus", Value: "orders"}, {Key: "ids", Value: bson.A{h.id}}}).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st.Locks[0].HeldByYou, st.Locks[0].Token
	}
	victim := hold("victim", bson.D{{Key: "1", Value: "x"}, {Key: "a", Value: "y"}})
	attacker := hold("attacker", bson.D{{Key: "a", Value: "y"}, {Key: "1", Value: "x"}})
	snowflake := hold("snowflake", int64(1<<53+1))
	_, victimToken := status(victim)

	bctx, stop := browser(t, ctx)
	defer stop()
	rowOf := func(app string) string {
		return `Array.from(document.querySelectorAll('#locks tbody tr')).find(tr => tr.querySelector('td.app').textContent === ` + jsString(app) + `)`
	}
	release := func(app string) string {
		t.Helper()
		var result string
		if err := chromedp.Run(bctx,
			chromedp.Evaluate(`document.getElementById('token').value = `+jsString(adminToken), nil),
			chromedp.Evaluate(`document.getElementById('result').textContent = ''`, nil),
			chromedp.Evaluate(rowOf(app)+`.querySelector('button.release').click()`, nil),
			chromedp.WaitVisible(`#release-dialog`, chromedp.ByQuery),
			chromedp.SendKeys(`#reason`, "operator test", chromedp.ByQuery),
			chromedp.Click(`#release-confirm`, chromedp.ByQuery),
			chromedp.Poll(`document.getElementById('result').textContent`, &result, chromedp.WithPollingTimeout(10*time.Second)),
		); err != nil {
			t.Fatalf("force-release of %s's row: %v", app, err)
		}
		return result
	}
	var attackerCell string
	if err := chromedp.Run(bctx,
		chromedp.Navigate("http://"+g.AdminAddr().String()+"/console/"),
		chromedp.Poll(`document.querySelectorAll('#locks tbody tr').length === 3`, nil, chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.Evaluate(rowOf("attacker")+`.cells[1].textContent`, &attackerCell),
	); err != nil {
		t.Fatalf("loading the console: %v", err)
	}
	if !strings.Contains(attackerCell, `"a":"y","1":"x"`) {
		t.Errorf("the attacker's row shows _id %s, want its own {\"a\": \"y\", \"1\": \"x\"}", attackerCell)
	}

	if got := release("attacker"); !strings.HasPrefix(got, "released kit.orders") {
		t.Fatalf("force-release of the attacker's row: %q, want released", got)
	}
	if held, tok := status(victim); !held || tok != victimToken {
		t.Errorf("after force-releasing the attacker's row the victim holds its lock: %v, token %d (was %d); want held, token unchanged", held, tok, victimToken)
	}
	if held, _ := status(attacker); held {
		t.Error("the attacker still holds the lock whose row was force-released")
	}

	if got := release("snowflake"); !strings.HasPrefix(got, "released kit.orders") || !strings.Contains(got, "9007199254740993") {
		t.Errorf("force-release of _id 2^53+1: %q, want released", got)
	}
	if held, _ := status(snowflake); held {
		t.Error("the lock on _id 2^53+1 is still held after its row was force-released")
	}
	if held, tok := status(victim); !held || tok != victimToken {
		t.Errorf("at the end the victim holds its lock: %v, token %d (was %d); want held, token unchanged", held, tok, victimToken)
	}
}

// startConsole starts a lockgate in front of the embedded FerretDB with
// kit.* enforced and an admin token, and returns it with the token. It
// skips (fails under CI) where chromium is missing.
func startConsole(t *testing.T, opts ...func(*config.Config)) (*gateway.Gateway, string) {
	t.Helper()
	testkit.RequireTool(t, "chromium", testkit.OnPath(chromiumPath, "apt-get install -y chromium"))
	up, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	const adminToken = "console-test-token-7f3a"
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URI = up.URI()
	cfg.AdminAuth.TokenFile = tokenFile
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "kit.*", Mode: config.ModeEnforce}}
	for _, o := range opts {
		o(cfg)
	}
	gctx, stopGW := context.WithCancel(context.Background())
	g, err := gateway.Start(gctx, cfg, zap.NewNop())
	if err != nil {
		stopGW()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopGW()
		<-g.Done()
	})
	return g, adminToken
}

// profileDir is a fresh chromium profile directory. Not t.TempDir: its
// cleanup removes the directory once, and a chromium helper process,
// outliving the browser by a moment, may still write there; this one is
// removed until the helpers have left it. One still writing there 10 s
// after the browser ended fails the test: it outlived the test.
func profileDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lockgate-console-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testkit.Eventually(t, 10*time.Second, "chromium's helpers to leave the profile "+dir, func() bool { return os.RemoveAll(dir) == nil })
	})
	return dir
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// browser starts headless chromium with a fresh profile and nothing that
// phones home.
func browser(t *testing.T, ctx context.Context) (context.Context, func()) {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profileDir(t)),
	)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(func(f string, a ...any) {
		msg := fmt.Sprintf(f, a...)
		// chromedp v0.14 does not know every event of Debian's newer
		// chromium; those notices are noise.
		if !strings.Contains(msg, "unhandled node event") && !errors.Is(ctx.Err(), context.Canceled) {
			t.Logf("chromedp: %s", msg)
		}
	}))
	return bctx, func() { cancelBrowser(); cancelAlloc() }
}

// The console as an operator's tool (issue 26, item 10): each rule's
// scheme, and only the settings its mode uses; on each lock whether it
// mirrors a scheme lock, since when it is held, and who waits for it
// (not only how many); decisions per minute, the current minute included;
// and, with the audit trail off, a page that says so.
func TestConsoleShowsSchemesWaitersAndRates(t *testing.T) {
	var direct string
	g, _ := startConsole(t, func(c *config.Config) {
		direct = c.Upstream.URI
		c.Policy.Namespaces = append(c.Policy.Namespaces,
			config.NamespaceRule{Match: "jobs.flag", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, Field: "locked", LeaseMS: 60000}},
			config.NamespaceRule{Match: "watch.*", Mode: config.ModeAudit},
			config.NamespaceRule{Match: "quiet.*", Mode: config.ModeOff})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sc, holderDB := session(t, ctx, g, "console-holder")
	if err := holderDB.RunCommand(sc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
		t.Fatal(err)
	}
	// A second application waits for the lock (until the test ends).
	wctx, stopWaiter := context.WithCancel(ctx)
	defer stopWaiter()
	wsc, waiterDB := session(t, wctx, g, "console-waiter")
	go waiterDB.RunCommand(wsc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "waitMS", Value: 60000}})
	// A refused write, counted in the current minute.
	if _, err := waiterDB.Collection("orders").UpdateOne(ctx, bson.M{"_id": 42}, bson.M{"$set": bson.M{"x": 1}}); err == nil {
		t.Fatal("a write without the lock was allowed")
	}
	// A flag taken under the jobs.flag scheme: lockgate mirrors it.
	dc, err := mongo.Connect(ctx, options.Client().ApplyURI(direct))
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Disconnect(context.Background())
	if _, err := dc.Database("jobs").Collection("flag").InsertOne(ctx, bson.M{"_id": 7, "locked": false}); err != nil {
		t.Fatal(err)
	}
	fc, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName("flagger"))
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Disconnect(context.Background())
	if res, err := fc.Database("jobs").Collection("flag").UpdateOne(ctx, bson.M{"_id": 7, "locked": false}, bson.M{"$set": bson.M{"locked": true}}); err != nil || res.ModifiedCount != 1 {
		t.Fatalf("taking the flag: %v %+v", err, res)
	}

	bctx, stop := browser(t, ctx)
	defer stop()
	orders := `#locks tr[data-namespace="kit.orders"][data-id="42"]`
	flag := `#locks tr[data-namespace="jobs.flag"][data-id="7"]`
	var waiting, since, ordersMirror, flagMirror, flagApp string
	if err := chromedp.Run(bctx,
		chromedp.Navigate("http://"+g.AdminAddr().String()+"/console/"),
		chromedp.WaitVisible(flag, chromedp.ByQuery),
		// The waiter queues a moment after its command is sent.
		chromedp.Poll(`(document.querySelector(`+jsString(orders+` td.waiters`)+`) || {}).textContent.includes('console-waiter')`, nil, chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.Text(orders+` td.waiters`, &waiting, chromedp.ByQuery),
		chromedp.Text(orders+` td.since`, &since, chromedp.ByQuery),
		chromedp.Text(orders+` td.mirror`, &ordersMirror, chromedp.ByQuery),
		chromedp.Text(flag+` td.mirror`, &flagMirror, chromedp.ByQuery),
		chromedp.Text(flag+` td.app`, &flagApp, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("loading the console: %v", err)
	}
	if !strings.HasPrefix(waiting, "1") || !strings.Contains(waiting, "console-waiter, 127.0.0.1:") || !strings.Contains(waiting, "waiting since ") {
		t.Errorf("waiters cell %q, want 1 and the waiter: console-waiter, its client address, waiting since", waiting)
	}
	if !regexp.MustCompile(`^\d\d:\d\d:\d\d \([0-9.ms ]+ ago\)$`).MatchString(since) {
		t.Errorf("held since %q, want HH:MM:SS (how long ago)", since)
	}
	if ordersMirror != "" || flagMirror != "mirrors flag (jobs.flag)" || flagApp != "flagger" {
		t.Errorf("scheme cells: kit.orders %q (want none), jobs.flag %q held by %q (want mirrors flag (jobs.flag), flagger)", ordersMirror, flagMirror, flagApp)
	}

	// The rules: a scheme with its fields; settings by mode.
	keys := func(match string) string {
		var out string
		if err := chromedp.Run(bctx, chromedp.Evaluate(`Array.from(document.querySelectorAll('#policy tr[data-match=`+jsString(match)+`] td.settings [data-key]')).map(d => d.dataset.key).join(',')`, &out)); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := keys("kit.*"); !strings.Contains(got, "inserts") || !strings.Contains(got, "fence") || !strings.Contains(got, "capped inserts") {
		t.Errorf("enforce rule settings %q, want inserts, capped inserts and fence among them", got)
	}
	if got := keys("watch.*"); !strings.Contains(got, "inserts") || strings.Contains(got, "fence") || strings.Contains(got, "capped") {
		t.Errorf("audit rule settings %q, want inserts and no fence or capped inserts (enforce only)", got)
	}
	if got := keys("quiet.*"); strings.Contains(got, "inserts") || strings.Contains(got, "lease margin") || strings.Contains(got, "candidates") {
		t.Errorf("off rule settings %q, want none of the write checks' settings", got)
	}
	var scheme, kitScheme string
	if err := chromedp.Run(bctx,
		chromedp.Text(`#policy tr[data-match="jobs.flag"] td.scheme`, &scheme, chromedp.ByQuery),
		chromedp.Text(`#policy tr[data-match="kit.*"] td.scheme`, &kitScheme, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(scheme, "flag") || !strings.Contains(scheme, "field: locked") || !strings.Contains(scheme, "lease: 60000 ms") || kitScheme != "lockgate" {
		t.Errorf("scheme cells: jobs.flag %q (want flag, field: locked, lease: 60000 ms), kit.* %q (want lockgate)", scheme, kitScheme)
	}

	// Decisions per minute: the refusal is in the current minute.
	var counts []string
	reject := `#decisions tr[data-rule="kit.*"][data-decision="reject"]`
	if err := chromedp.Run(bctx,
		chromedp.Poll(`!!document.querySelector(`+jsString(reject)+`)`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(`Array.from(document.querySelectorAll(`+jsString(reject)+`)).map(tr => tr.dataset.reason + ' ' + tr.querySelector('td.now').textContent + ' ' + tr.querySelector('td.total').textContent)`, &counts),
	); err != nil {
		t.Fatalf("decision rates: %v", err)
	}
	if !slices.Contains(counts, "held_by_other 1 1") {
		t.Errorf("kit.* rejects (reason, this minute, since start): %q; want the refused write, held_by_other, in this minute", counts)
	}
	var auditOff bool
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.getElementById('audit-off').offsetParent !== null && document.getElementById('audit-form').offsetParent === null`, &auditOff)); err != nil || !auditOff {
		t.Errorf("with the audit trail off the page should say so and show no query form (%v)", err)
	}
}

// The audit history panel (issue 24, item 5): with the trail on, a
// document's history and a holder's, as the trail recorded them, every
// value as text.
func TestConsoleAuditHistory(t *testing.T) {
	g, _ := startConsole(t, func(c *config.Config) {
		dir := t.TempDir()
		key := filepath.Join(dir, "key")
		if err := os.WriteFile(key, []byte(strings.Repeat("k", 40)), 0o600); err != nil {
			t.Fatal(err)
		}
		c.Audit.Enabled, c.Audit.Dir, c.Audit.KeyFile, c.Audit.Instance = true, filepath.Join(dir, "trail"), key, "console-1"
		c.Audit.CheckpointEvery = 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const app = `auditor<img id="injected-audit" src=x>`
	sc, db := session(t, ctx, g, app)
	acq, err := db.RunCommand(sc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{"a-1"}}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := acq.Lookup("holder", "tag").StringValueOK()
	if _, err := db.Collection("orders").InsertOne(sc, bson.M{"_id": "a-1", "n": 1}); err != nil {
		t.Fatal(err)
	}

	bctx, stop := browser(t, ctx)
	defer stop()
	query := func(fields map[string]string) [][]string {
		t.Helper()
		var rows [][]string
		js := ``
		for _, id := range []string{"audit-ns", "audit-id", "audit-holder"} {
			js += `document.getElementById(` + jsString(id) + `).value = ` + jsString(fields[id]) + `;`
		}
		// The trail is written in batches: ask again until the write
		// is there.
		if err := chromedp.Run(bctx,
			chromedp.Poll(`(() => { `+js+` document.getElementById('audit-query').click();
				return Array.from(document.querySelectorAll('#audit-records tbody tr')).some(tr => tr.dataset.kind === 'decision'); })()`,
				nil, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(500*time.Millisecond)),
			chromedp.Evaluate(`Array.from(document.querySelectorAll('#audit-records tbody tr')).map(tr => Array.from(tr.cells).map(td => td.textContent))`, &rows),
		); err != nil {
			var note string
			chromedp.Run(bctx, chromedp.Text(`#audit-note`, &note, chromedp.ByQuery))
			t.Fatalf("history %v: %v (note %q)", fields, err, note)
		}
		return rows
	}
	if err := chromedp.Run(bctx, chromedp.Navigate("http://"+g.AdminAddr().String()+"/console/"), chromedp.WaitVisible(`#audit-form`, chromedp.ByQuery)); err != nil {
		t.Fatalf("loading the console: %v", err)
	}
	check := func(what string, rows [][]string) {
		t.Helper()
		var lock, write bool
		for _, r := range rows {
			// time, kind, op, ns, _id, verdict, reason, app, user, client, holder, tokens
			if len(r) != 12 || r[3] != "kit.orders" || r[4] != `"a-1"` || r[7] != app || r[10] != tag {
				continue
			}
			lock = lock || (r[1] == "lock" && r[2] == "acquire" && regexp.MustCompile(`^\d+$`).MatchString(r[11]))
			write = write || (r[1] == "decision" && r[2] == "insert" && r[5] == "allow")
		}
		if !lock || !write {
			t.Errorf("%s: rows %q; want the acquire (with its token) and the allowed insert, by %q under holder tag %s", what, rows, app, tag)
		}
	}
	check("the document's history", query(map[string]string{"audit-ns": "kit.orders", "audit-id": "a-1"}))
	check("the holder's history", query(map[string]string{"audit-holder": tag}))
	var injected bool
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.getElementById('injected-audit') !== null`, &injected)); err != nil || injected {
		t.Errorf("the application name in a record was rendered as markup (%v)", err)
	}
}

// session connects as app and starts an explicit session in the kit
// database.
func session(t *testing.T, ctx context.Context, g *gateway.Gateway, app string) (context.Context, *mongo.Database) {
	t.Helper()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName(app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	sess, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.EndSession(context.Background()) })
	return mongo.NewSessionContext(ctx, sess), c.Database("kit")
}

// TestConsoleScreenshot renders the console with a scheme rule, a held lock
// with a waiter, a mirrored scheme lock and some decisions, and saves it
// where LOCKGATE_CONSOLE_SCREENSHOT says (docs/console.png is made so:
// LOCKGATE_CONSOLE_SCREENSHOT=$PWD/docs/console.png go test ./tests/console
// -run TestConsoleScreenshot). Skipped without the variable.
func TestConsoleScreenshot(t *testing.T) {
	out := os.Getenv("LOCKGATE_CONSOLE_SCREENSHOT")
	if out == "" {
		t.Skip("LOCKGATE_CONSOLE_SCREENSHOT not set")
	}
	var direct string
	g, _ := startConsole(t, func(c *config.Config) {
		direct = c.Upstream.URI
		dir := t.TempDir()
		key := filepath.Join(dir, "key")
		if err := os.WriteFile(key, []byte(strings.Repeat("k", 40)), 0o600); err != nil {
			t.Fatal(err)
		}
		c.Audit.Enabled, c.Audit.Dir, c.Audit.KeyFile, c.Audit.Instance = true, filepath.Join(dir, "trail"), key, "lockgate-1"
		c.Policy.Namespaces = []config.NamespaceRule{
			{Match: "kit.orders", Mode: config.ModeEnforce, Fence: config.FenceDocument},
			{Match: "kit.*", Mode: config.ModeAudit},
			{Match: "jobs.items", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, Field: "LockId", TimeField: "LockTime", LeaseMS: 30000}},
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sc, db := session(t, ctx, g, "billing")
	if err := db.RunCommand(sc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "leaseMS", Value: 300000}}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Collection("orders").InsertOne(sc, bson.M{"_id": 42, "total": 10}); err != nil {
		t.Fatal(err)
	}
	wctx, stopWaiter := context.WithCancel(ctx)
	defer stopWaiter()
	wsc, wdb := session(t, wctx, g, "invoicer")
	go wdb.RunCommand(wsc, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "waitMS", Value: 60000}})
	_, rogue := session(t, ctx, g, "reporting")
	for i := 0; i < 3; i++ {
		rogue.Collection("orders").UpdateOne(ctx, bson.M{"_id": 42}, bson.M{"$inc": bson.M{"total": 1}})
	}
	rogue.Collection("customers").UpdateOne(ctx, bson.M{"_id": 1}, bson.M{"$set": bson.M{"seen": true}})
	// A holderFields lock taken the application's way, which lockgate
	// mirrors.
	dc, err := mongo.Connect(ctx, options.Client().ApplyURI(direct))
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Disconnect(context.Background())
	dc.Database("jobs").Collection("items").InsertOne(ctx, bson.M{"_id": "job-7"})
	jc, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName("worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer jc.Disconnect(context.Background())
	if err := jc.Database("jobs").Collection("items").FindOneAndUpdate(ctx,
		bson.M{"_id": "job-7", "$or": bson.A{bson.M{"LockId": nil}, bson.M{"LockTime": bson.M{"$lt": time.Now().Add(-30 * time.Second)}}}},
		bson.M{"$set": bson.M{"LockId": "w-1", "LockTime": time.Now()}}).Err(); err != nil {
		t.Fatalf("the holderFields acquire: %v", err)
	}

	bctx, stop := browser(t, ctx)
	defer stop()
	var png []byte
	if err := chromedp.Run(bctx,
		chromedp.EmulateViewport(1500, 1500),
		chromedp.Navigate("http://"+g.AdminAddr().String()+"/console/"),
		chromedp.Poll(`document.querySelector('#locks td.waiters li') !== null && document.querySelector('#locks tr[data-namespace="jobs.items"]') !== null`, nil, chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.Evaluate(`document.getElementById('audit-ns').value = 'kit.orders'; document.getElementById('audit-id').value = '42'`, nil),
		chromedp.Poll(`(() => { document.getElementById('audit-query').click();
			return document.querySelectorAll('#audit-records tbody tr[data-kind="decision"]').length >= 4; })()`,
			nil, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(500*time.Millisecond)),
		chromedp.FullScreenshot(&png, 100), // 100: PNG (below, JPEG),
	); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
}
