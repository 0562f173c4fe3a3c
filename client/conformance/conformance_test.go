package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

var upstream *embedded.Server

func TestMain(m *testing.M) {
	os.Exit(testkit.RunMain(m, embedded.Shared(&upstream, embedded.Options{})))
}

// stack is a lockgate whose lock store is reached through a relay that a
// POST to cutURL cuts.
type stack struct {
	proxyURI, cutURL string
}

func startStack(t *testing.T, db string) stack {
	t.Helper()
	r := testkit.StartRelay(t, upstream.Addr())
	cfg := gatewaytest.Config(upstream.URI())
	cfg.Lockstore.URI = r.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: db + ".*", Mode: config.ModeEnforce}}
	g := gatewaytest.Start(t, cfg, nil)
	// Registered after the gateway's stop, so it runs before it: a lock
	// store left cut would make the stop wait out the store's time-outs
	// (its deregistration and disconnect, about 10 s), which tests nothing.
	var cut atomic.Bool
	t.Cleanup(func() {
		if cut.Load() {
			r.Restore(t)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/cut" {
			http.NotFound(w, req)
			return
		}
		r.Cut()
		cut.Store(true)
		fmt.Fprintln(w, "cut")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return stack{proxyURI: g.URI, cutURL: "http://" + ln.Addr().String() + "/cut"}
}

// runScenarios runs a helper's scenario script and returns its JSON lines
// by case.
func runScenarios(t *testing.T, st stack, db string, env []string, name string, args ...string) map[string]map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), append(env, "LOCKGATE_URI="+st.proxyURI, "DIRECT_URI="+upstream.URI(), "CUT_URL="+st.cutURL, "DB="+db)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", name, args, err, outb, stderr.String())
	}
	res := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(outb))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		res[m["case"].(string)] = m
		t.Logf("%s", sc.Bytes())
	}
	return res
}

// The helpers' tests run beside each other, each with its own gateway,
// relay and database: most of their time is waiting (renewals through
// three leases, the lock-wait time-outs), not CPU.
func TestPythonHelper(t *testing.T) {
	t.Parallel()
	testkit.RequireTool(t, "pymongo", testkit.Pymongo())
	const db = "kit_py"
	st := startStack(t, db)
	res := runScenarios(t, st, db, nil, "/usr/bin/python3", "../python/tests/scenarios.py")
	judge(t, res, "py-holder", map[string]string{
		"busy": "LockBusy", "timeout": "LockTimeout", "notHeld": "LockNotHeld", "lost": "LockLost",
		"notProtected": "NotProtected", "invalid": "InvalidLockRequest",
	})
	// Issue 26: the helper takes wait= and lease= in seconds, so its
	// errors name those, not the lock commands' waitMS and leaseMS.
	if e, _ := res["busy"]["error"].(map[string]any); e == nil || !strings.Contains(fmt.Sprint(e["msg"]), "wait= (seconds)") || strings.Contains(fmt.Sprint(e["msg"]), "waitMS") {
		t.Errorf("busy: message %q, want it to name wait= (seconds), not waitMS", e["msg"])
	}
	// And lost comes as a callback too, exactly once, from the helper's
	// own thread, with the LockLost error.
	r := res["lost_callback"]
	calls, _ := r["calls"].([]any)
	if r["fired"] != true || r["lostSet"] != true || len(calls) != 1 {
		t.Fatalf("lost_callback: %v, want one call", r)
	}
	c, _ := calls[0].([]any)
	if len(c) != 3 || c[0] != "LockLost" || c[1] != "not_holder" || !strings.HasPrefix(fmt.Sprint(c[2]), "lockgate-") {
		t.Errorf("lost_callback: call %v, want (LockLost, not_holder, a lockgate-* thread)", c)
	}
}

func TestNodeHelper(t *testing.T) {
	t.Parallel()
	modules, _ := filepath.Abs("../../tests/compat/node/node_modules")
	testkit.RequireTool(t, "the Node.js driver", testkit.NodeModule(modules, "mongodb"))
	const db = "kit_node"
	st := startStack(t, db)
	res := runScenarios(t, st, db, []string{"NODE_PATH=" + modules}, "node", "../node/test/scenarios.js")
	judge(t, res, "node-holder", map[string]string{
		"busy": "LockBusyError", "timeout": "LockTimeoutError", "notHeld": "LockNotHeldError", "lost": "LockLostError",
		"notProtected": "NotProtectedError", "invalid": "InvalidLockRequestError",
	})
}

// judge checks the scenarios both helpers run; class maps the error kinds
// to the helper's class names.
func judge(t *testing.T, res map[string]map[string]any, holderApp string, class map[string]string) {
	t.Helper()
	get := func(c string) map[string]any {
		m, ok := res[c]
		if !ok {
			t.Errorf("scenario %q did not report", c)
			return map[string]any{}
		}
		return m
	}
	errOf := func(c string) map[string]any {
		e, _ := get(c)["error"].(map[string]any)
		if e == nil {
			t.Errorf("%s: no error, want one", c)
			return map[string]any{}
		}
		return e
	}
	if e := errOf("busy"); e["class"] != class["busy"] || e["code"] != 46.0 {
		t.Errorf("busy: %v", e)
	} else if h, _ := e["holder"].(map[string]any); h == nil || h["app"] != holderApp {
		t.Errorf("busy: holder %v, want app %s", e["holder"], holderApp)
	} else if tag, _ := get("busy")["holderTag"].(string); len(tag) != 8 || h["tag"] != tag {
		t.Errorf("busy: the refusal names holder tag %v, the holder's lock says %q; want the same 8 hex digits (issue 26, item 2)", h["tag"], tag)
	}
	if e := errOf("timeout"); e["class"] != class["timeout"] || e["code"] != 24.0 {
		t.Errorf("timeout: %v", e)
	} else if ms, _ := get("timeout")["elapsedMS"].(float64); ms < 250 {
		t.Errorf("timeout after %vms, before the 300ms wait", ms)
	}
	if tok := token(get("after_release")["token"]); tok == 0 {
		t.Errorf("after_release: %v", get("after_release"))
	}
	w := get("with_lock")
	if w["raised"] != "payment provider said no" || w["outsideCode"] != 46.0 || w["lastError"] == nil ||
		!(token(w["nextToken"]) > token(w["firstToken"])) || token(w["firstToken"]) == 0 {
		t.Errorf("with_lock: %v (want the exception to propagate, a write outside the session refused with 46, "+
			"the lock released with the error recorded, a higher token for the next holder)", w)
	}
	if r := get("refused_renewal"); r["lost"] != true || r["error"] != class["lost"] || r["reason"] != "not_holder" || r["release"] != class["notHeld"] {
		t.Errorf("refused_renewal: %v", r)
	}
	if r := get("lost_in_block"); r["raised"] != class["lost"] || r["aborted"] == false {
		t.Errorf("lost_in_block: %v (want the loss reported on leaving the block, and the signal aborted in Node)", r)
	}
	if e := errOf("not_protected"); e["class"] != class["notProtected"] {
		t.Errorf("not_protected: %v", e)
	}
	if e := errOf("no_session"); e["class"] != class["invalid"] {
		t.Errorf("no_session: %v", e)
	}
	r := get("renew_then_cut")
	lease, _ := r["leaseMS"].(float64)
	if held, _ := r["heldMS"].(float64); held < 3*lease || r["writeError"] != nil || r["lostEarly"] != false || r["tokenSame"] != true || r["otherError"] != class["busy"] {
		t.Errorf("renew_then_cut: the lock was not kept through three leases while writing: %v", r)
	}
	if after, _ := r["lostAfterMS"].(float64); r["lost"] != true || after > lease || r["error"] != class["lost"] {
		t.Errorf("renew_then_cut: lost %v after %vms (lease %vms), want within one lease: %v", r["lost"], after, lease, r)
	}
}

// token reads a fencing token that a script printed as a decimal
// string: tokens use all 64 bits, past what JSON numbers carry exactly.
func token(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
