package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
	if len(cells) < 10 || cells[0] != "kit.orders" || cells[1] != "42" || cells[2] != app || cells[6] != fmt.Sprint(tok) || !strings.HasSuffix(cells[7], "s") || cells[8] != "0" {
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
		return `Array.from(document.querySelectorAll('#locks tbody tr')).find(tr => tr.cells[2].textContent === ` + jsString(app) + `)`
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
func startConsole(t *testing.T) (*gateway.Gateway, string) {
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
		chromedp.UserDataDir(t.TempDir()),
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
