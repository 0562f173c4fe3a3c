package enforcement

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
)

// nodeModules is the Node.js install shared with tests/compat (the driver
// `mongodb` and the shell `mongosh`); this package only reads it.
const nodeModules = "../compat/node/node_modules"

// A driver under test: a real client run as a subprocess.
type driver struct {
	name string
	// db is the database its script works in (enforced by TestMain).
	db string
	// holderApp is the appname of the script's lock-holding client.
	holderApp string
	// missing says how to install the runtime, nil when it is there.
	missing func() error
	// command runs the script: proxy URI, direct URI, database.
	command func(ctx context.Context, proxy, direct, db string) *exec.Cmd
	// names picks the driver's own name of a write API (the case name).
	names func(api writeAPI) string
}

func drivers() []driver {
	return []driver{
		{
			name:      "pymongo",
			db:        "enf_pymongo",
			holderApp: "enf-pymongo-holder",
			missing:   testkit.Pymongo,
			command: func(ctx context.Context, proxy, direct, db string) *exec.Cmd {
				return exec.CommandContext(ctx, "/usr/bin/python3", "pymongo/enforce.py", proxy, direct, db)
			},
			names: func(a writeAPI) string { return a.py },
		},
		{
			name:      "node",
			db:        "enf_node",
			holderApp: "enf-node-holder",
			missing:   func() error { return testkit.NodeModule(nodeModules, "mongodb") },
			command: func(ctx context.Context, proxy, direct, db string) *exec.Cmd {
				return exec.CommandContext(ctx, "node", "node/enforce.js", proxy, direct, db)
			},
			names: func(a writeAPI) string { return a.node },
		},
		{
			name:      "mongosh",
			db:        "enf_mongosh",
			holderApp: "enf-mongosh-holder",
			missing:   func() error { return testkit.NodeModule(nodeModules, "mongosh") },
			command: func(ctx context.Context, proxy, direct, db string) *exec.Cmd {
				// mongosh scripts take no arguments: they read these.
				cmd := exec.CommandContext(ctx, filepath.Join(nodeModules, ".bin", "mongosh"),
					"--nodb", "--quiet", "--norc", "--file", "node/enforce_mongosh.js")
				cmd.Env = append(os.Environ(), "ENF_PROXY="+proxy, "ENF_DIRECT="+direct, "ENF_DB="+db)
				return cmd
			},
			// The shell's helpers have the Node.js driver's names.
			names: func(a writeAPI) string { return a.node },
		},
	}
}

// report is one JSON line of a script: one check.
type report struct {
	Case  string `json:"case"`
	Error *struct {
		Type     string  `json:"type"`
		Code     *int    `json:"code"`
		CodeName *string `json:"codeName"`
		Errmsg   string  `json:"errmsg"`
		// Detail is the reply's lockgate document, canonical extended
		// JSON; Raw the whole error reply, for diagnostics.
		Detail *string `json:"detail"`
		Raw    *string `json:"raw"`
	} `json:"error"`
	// Result is what the driver returned, canonical extended JSON of
	// {matched, modified, deleted, inserted, upserted, upsertedId} or {doc}.
	Result *string `json:"result"`
	// Before and After are the whole collection read directly, sorted by
	// _id, canonical extended JSON of {docs: [...]}.
	Before string `json:"before"`
	After  string `json:"after"`
	line   string
}

// change is what one document must look like after an applied write.
type change struct {
	deleted bool
	exact   bson.D // the whole document, byte for byte
	fields  bson.D // fields it must have (others unchecked)
}

// applied is what an accepted write must have done: exactly the documents
// in changes differ (every other document is byte-identical), and the
// driver's result has counts and, for findOneAndX, the returned doc's _id.
type applied struct {
	changes  map[int32]change
	counts   map[string]int64
	upserted any
	returned any // _id of the returned document
}

// writeAPI is one write API call, the same in every driver's script, with
// what it does when the caller holds the locks. In the "own" situation the
// calls run in this order on one collection seeded with _id 1..6 (1-3
// status "open", 4-6 "closed"), so each expectation reflects the ones
// before it.
type writeAPI struct {
	py, node string
	own      applied
}

// resolved lists the writes whose filter names no _id and that name no _id
// to upsert either: the proxy finds their documents itself, and a refusal
// may count them but never name them or their holder (the resolver is no
// oracle: issue 10, item 5).
func (api writeAPI) resolved() bool {
	switch api.py {
	case "update_many_unpinned", "find_one_and_replace_unpinned", "upsert_unpinned_match", "delete_many_unpinned":
		return true
	}
	return false
}

func set(kv ...any) change {
	var d bson.D
	for i := 0; i < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return change{fields: d}
}

var deleted = change{deleted: true}

func writeAPIs() []writeAPI {
	return []writeAPI{
		{"update_one", "updateOne", applied{
			changes: map[int32]change{1: set("qty", int32(11))},
			counts:  map[string]int64{"matched": 1, "modified": 1}}},
		{"update_many_pinned", "updateMany_pinned", applied{
			changes: map[int32]change{1: set("flag", "m"), 2: set("flag", "m")},
			counts:  map[string]int64{"matched": 2, "modified": 2}}},
		// The filter does not pin _id: resolved to 1..3, all locked.
		{"update_many_unpinned", "updateMany_unpinned", applied{
			changes: map[int32]change{1: set("seen", true), 2: set("seen", true), 3: set("seen", true)},
			counts:  map[string]int64{"matched": 3, "modified": 3}}},
		{"replace_one", "replaceOne", applied{
			changes: map[int32]change{2: {exact: bson.D{{"_id", int32(2)}, {"status", "open"}, {"qty", int32(22)}, {"sku", "b2"}}}},
			counts:  map[string]int64{"matched": 1, "modified": 1}}},
		{"find_one_and_update", "findOneAndUpdate", applied{
			changes:  map[int32]change{4: set("qty", int32(44))},
			returned: int32(4)}},
		{"find_one_and_replace_unpinned", "findOneAndReplace_unpinned", applied{
			changes:  map[int32]change{5: {exact: bson.D{{"_id", int32(5)}, {"status", "closed"}, {"qty", int32(55)}, {"sku", "e2"}}}},
			returned: int32(5)}},
		{"find_one_and_delete", "findOneAndDelete", applied{
			changes:  map[int32]change{6: deleted},
			returned: int32(6)}},
		{"delete_one", "deleteOne", applied{
			changes: map[int32]change{3: deleted},
			counts:  map[string]int64{"deleted": 1}}},
		{"bulk_write_ordered", "bulkWrite_ordered", applied{
			changes: map[int32]change{
				1:   set("bulk", "u"),
				2:   {exact: bson.D{{"_id", int32(2)}, {"status", "open"}, {"qty", int32(222)}, {"sku", "b3"}}},
				4:   deleted,
				100: {exact: bson.D{{"_id", int32(100)}, {"status", "new"}}},
			},
			counts: map[string]int64{"matched": 2, "modified": 2, "deleted": 1, "inserted": 1}}},
		{"bulk_write_unordered", "bulkWrite_unordered", applied{
			changes: map[int32]change{5: set("bulk", "v"), 100: deleted},
			counts:  map[string]int64{"matched": 1, "modified": 1, "deleted": 1}}},
		// (The server orders the fields $set creates by name, so only the
		// fields are checked.)
		{"upsert_pinned", "upsert_pinned", applied{
			changes:  map[int32]change{200: set("status", "new", "qty", int32(200))},
			counts:   map[string]int64{"matched": 0, "modified": 0},
			upserted: int32(200)}},
		// An upsert whose filter does not pin _id and matches doc 1.
		{"upsert_unpinned_match", "upsert_unpinned_match", applied{
			changes: map[int32]change{1: set("via", "upsert")},
			counts:  map[string]int64{"matched": 1, "modified": 1}}},
		// An upsert that matches nothing and inserts the _id named in
		// $setOnInsert: it needs that _id's lock. The inserted document
		// takes the filter's equality field (sku: "zz"), as the server
		// does when the same upsert is sent to it directly.
		{"upsert_unpinned_setOnInsert_id", "upsert_unpinned_setOnInsert_id", applied{
			changes:  map[int32]change{201: set("sku", "zz", "status", "new")},
			counts:   map[string]int64{"matched": 0, "modified": 0},
			upserted: int32(201)}},
		// NumberLong(1) and 2.0 are the locks on 1 and 2.
		{"update_many_mixed_numeric_ids", "updateMany_mixed_numeric_ids", applied{
			changes: map[int32]change{1: set("num", "x"), 2: set("num", "x")},
			counts:  map[string]int64{"matched": 2, "modified": 2}}},
		// An upsert whose replacement names the _id it inserts.
		{"replace_one_upsert_unpinned", "replaceOne_upsert_unpinned", applied{
			changes:  map[int32]change{202: {exact: bson.D{{"_id", int32(202)}, {"sku", "q"}, {"status", "new"}}}},
			counts:   map[string]int64{"matched": 0, "modified": 0},
			upserted: int32(202)}},
		{"find_one_and_update_upsert_pinned", "findOneAndUpdate_upsert_pinned", applied{
			changes:  map[int32]change{203: set("status", "new")},
			returned: int32(203)}},
		// Left with status "closed": only 5 (4 and 6 are gone).
		{"delete_many_unpinned", "deleteMany_unpinned", applied{
			changes: map[int32]change{5: deleted},
			counts:  map[string]int64{"deleted": 1}}},
	}
}

// TestEnforcementWithRealDrivers runs each driver's script through the
// gateway of TestMain and checks every case it must report.
func TestEnforcementWithRealDrivers(t *testing.T) {
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			testkit.RequireTool(t, d.name, d.missing())
			// The w:0 write is the script's only one without an lsid:
			// exactly one no_session refusal on its database, and a
			// connection closed for it (the counter is shared by the
			// drivers running in parallel, so at least one).
			noSession := map[string]string{"rule": d.db + ".*", "decision": "reject", "reason": "no_session"}
			unack := map[string]string{"kind": "unack_rejected"}
			noSession0, unack0 := metricValue(t, "lockgate_decisions_total", noSession), metricValue(t, "lockgate_errors_total", unack)
			reports := runScript(t, d)
			checkReports(t, d, reports)
			if n := metricValue(t, "lockgate_decisions_total", noSession) - noSession0; n != 1 {
				t.Errorf("%s: lockgate_decisions_total%v rose by %v, want 1 (the unacknowledged write)", d.name, noSession, n)
			}
			if n := metricValue(t, "lockgate_errors_total", unack) - unack0; n < 1 {
				t.Errorf("%s: lockgate_errors_total%v rose by %v, want at least 1", d.name, unack, n)
			}
		})
	}
}

func runScript(t *testing.T, d driver) map[string]*report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Second)
	defer cancel()
	cmd := d.command(ctx, proxyURI, directURI, d.db)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s script ran in %v", d.name, time.Since(start).Round(time.Millisecond))
	if err != nil {
		// The cases it did report are still checked (the missing ones
		// then fail too), which tells more than the exit status.
		t.Errorf("%s script: %v\nstderr:\n%s", d.name, err, stderr.Bytes())
	} else if stderr.Len() > 0 {
		t.Logf("%s stderr:\n%s", d.name, stderr.Bytes())
	}
	reports := map[string]*report{}
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var r report
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Case == "" {
			t.Fatalf("%s script printed a line that is not a check (%v): %s", d.name, err, sc.Text())
		}
		if reports[r.Case] != nil {
			t.Fatalf("%s script reported case %s twice", d.name, r.Case)
		}
		r.line = sc.Text()
		reports[r.Case] = &r
	}
	return reports
}

// checkReports asserts every case a driver's script must report, and that
// it reports nothing else.
func checkReports(t *testing.T, d driver, reports map[string]*report) {
	seen := map[string]bool{}
	get := func(name string) *report {
		seen[name] = true
		r := reports[name]
		if r == nil {
			t.Errorf("%s: case %s missing from the script's output", d.name, name)
		}
		return r
	}

	// (1) No lock at all: refused, nothing changed.
	for _, api := range writeAPIs() {
		if r := get("nolock/" + d.names(api)); r != nil {
			checkRefused(t, r, "not_locked", "")
		}
	}
	// An unacknowledged write without a lock: nothing written, and the
	// client goes on working after the proxy closed its connection.
	if r := get("nolock/unacknowledged_update_one"); r != nil {
		checkUnacknowledged(t, r)
	}
	// (2) Locked by another session of another application: refused, and
	// the refusal names the holder.
	checkSetup(t, get("other/holder_acquireLock"), -1)
	for _, api := range writeAPIs() {
		r := get("other/" + d.names(api))
		switch {
		case r == nil:
		case api.resolved():
			if checkRefused(t, r, "not_locked", "") {
				checkNoOracle(t, r, d.holderApp)
			}
		default:
			checkRefused(t, r, "held_by_other", d.holderApp)
		}
	}
	checkSetup(t, get("other/holder_releaseLock"), lockedIDs)
	// (3) Locked by the caller's session, writes in that session: applied.
	checkSetup(t, get("own/acquireLock"), -1)
	// The other two lock commands, from every driver: renew keeps every
	// lock with a token, status shows each held by the caller.
	checkLockReply(t, get("own/renewLock"), lockedIDs, false)
	checkLockReply(t, get("own/lockStatus"), lockedIDs, true)
	for _, api := range writeAPIs() {
		if r := get("own/" + d.names(api)); r != nil {
			checkApplied(t, r, api.own)
		}
		// The reference for the upsert that inserts: the same call sent
		// directly to the server must do what the proxy is expected to.
		if api.py == "upsert_unpinned_setOnInsert_id" {
			if r := get("direct/" + d.names(api)); r != nil {
				checkApplied(t, r, api.own)
			}
		}
	}
	checkSetup(t, get("own/releaseLock"), lockedIDs)
	// Pinning: doc 4 matches the filter and is not locked -> refused whole.
	checkSetup(t, get("pin/acquireLock"), -1)
	if r := get("pin/unlocked_match_refused"); r != nil {
		if checkRefused(t, r, "not_locked", "") {
			checkNoOracle(t, r, "")
			if !strings.Contains(r.Error.Errmsg, "1 document its filter matches") {
				t.Errorf("%s: errmsg %q does not count the one unlocked match", r.Case, r.Error.Errmsg)
			}
			if got := snapshotIDs(t, r.Before); strings.Join(got, ",") != "1,2,3,4" {
				t.Errorf("%s: collection before holds %v, want 1,2,3,4", r.Case, got)
			}
		}
	}
	// ... and once doc 4 is gone, applied to exactly 1..3.
	if r := get("pin/locked_matches_applied"); r != nil {
		if got := snapshotIDs(t, r.Before); strings.Join(got, ",") != "1,2,3" {
			t.Errorf("%s: collection before holds %v, want 1,2,3", r.Case, got)
		}
		checkApplied(t, r, applied{
			changes: map[int32]change{1: set("status", "done"), 2: set("status", "done"), 3: set("status", "done")},
			counts:  map[string]int64{"matched": 3, "modified": 3},
		})
	}
	checkSetup(t, get("pin/releaseLock"), 3)
	for name := range reports {
		if !seen[name] {
			t.Errorf("%s: the script reported case %s, which the test does not know", d.name, name)
		}
	}
}

// lockedIDs is how many ids the scripts lock in the "other" and "own"
// situations (LOCK_IDS), which a release-all must report released.
const lockedIDs = 11

// checkSetup asserts a lock command the script needs: it succeeded, wrote
// nothing to the collection and, for a release (released >= 0), released
// that many locks.
func checkSetup(t *testing.T, r *report, released int64) {
	t.Helper()
	switch {
	case r == nil:
		return
	case r.Error != nil:
		t.Errorf("%s failed, so the cases around it prove nothing: %s", r.Case, r.line)
		return
	case r.Before != r.After:
		t.Errorf("%s changed the collection: %s", r.Case, r.line)
	}
	if released < 0 {
		// An acquire: the reply names the session that now holds the
		// locks, for each driver (the implicit-session trap, issue 9).
		if res, err := parseDoc(deref(r.Result)); err == nil && strings.HasSuffix(r.Case, "acquireLock") {
			s, _ := res.Lookup("session").StringValueOK()
			note, _ := res.Lookup("note").StringValueOK()
			if len(s) != 8 || !strings.Contains(note, s) || !strings.Contains(note, "explicit session") {
				t.Errorf("%s: the reply does not name the holding session (session %q, note %q): %s", r.Case, s, note, r.line)
			}
		}
		return
	}
	res, err := parseDoc(deref(r.Result))
	if err != nil {
		t.Errorf("%s: reply does not parse: %v", r.Case, err)
		return
	}
	if n, ok := res.Lookup("released").AsInt64OK(); !ok || n != released {
		t.Errorf("%s: released = %v, want %d: %s", r.Case, res.Lookup("released"), released, r.line)
	}
}

// checkUnacknowledged asserts a refused w:0 write: the driver saw no
// error (it expects no reply), nothing was written, and the client worked
// again afterwards.
func checkUnacknowledged(t *testing.T, r *report) {
	t.Helper()
	if r.Error != nil {
		t.Errorf("%s: the driver failed: code %v: %s\n%s", r.Case, derefInt(r.Error.Code), r.Error.Errmsg, r.line)
		return
	}
	if r.Before != r.After {
		t.Errorf("%s: a refused unacknowledged write changed the collection:\nbefore %s\nafter  %s", r.Case, r.Before, r.After)
	}
	res, err := parseDoc(deref(r.Result))
	if err != nil {
		t.Errorf("%s: result does not parse: %v\n%s", r.Case, err, r.line)
		return
	}
	if ack, ok := res.Lookup("acknowledged").BooleanOK(); !ok || ack {
		t.Errorf("%s: the write was not sent unacknowledged (acknowledged = %v)", r.Case, res.Lookup("acknowledged"))
	}
	if ping, _ := res.Lookup("ping").StringValueOK(); ping != "ok" && ping != "ok_after_retry" {
		t.Errorf("%s: the client did not recover after the proxy closed its connection: ping = %q", r.Case, ping)
	}
}

// checkRefused asserts a LockBusy refusal with the given reason that left
// the collection byte-for-byte unchanged; holderApp, when set, must be
// named in errmsg and in the detail. It reports whether all held.
func checkRefused(t *testing.T, r *report, reason, holderApp string) bool {
	t.Helper()
	ok := true
	fail := func(format string, args ...any) {
		t.Errorf("%s: "+format+"\n%s", append(append([]any{r.Case}, args...), r.line)...)
		ok = false
	}
	if r.Before != r.After {
		fail("a refused write changed the collection:\nbefore %s\nafter  %s", r.Before, r.After)
	}
	if r.Error == nil {
		fail("write was not refused (result %v)", deref(r.Result))
		return false
	}
	e := r.Error
	if e.Code == nil || *e.Code != 46 {
		fail("error code %v, want 46", derefInt(e.Code))
	}
	if e.CodeName == nil || *e.CodeName != "LockBusy" {
		fail("codeName %v, want LockBusy", deref(e.CodeName))
	}
	if !strings.HasPrefix(e.Errmsg, "lockgate: ") || !strings.Contains(e.Errmsg, "refused") || !strings.Contains(e.Errmsg, "acquireLock") {
		fail("errmsg %q does not read like lockgate's refusal (what was refused, and to use acquireLock)", e.Errmsg)
	}
	if holderApp != "" && !strings.Contains(e.Errmsg, fmt.Sprintf("application %q", holderApp)) {
		fail("errmsg %q does not name the holder's application %q", e.Errmsg, holderApp)
	}
	detail, err := parseDoc(deref(e.Detail))
	if err != nil {
		fail("no lockgate detail document in the error (%v)", err)
		return false
	}
	if got, _ := detail.Lookup("reason").StringValueOK(); got != reason {
		fail("detail reason %q, want %q", got, reason)
	}
	if holderApp != "" {
		if got, _ := detail.Lookup("holder", "app").StringValueOK(); got != holderApp {
			fail("detail holder.app %q, want %q", got, holderApp)
		}
	}
	return ok
}

// checkApplied asserts an accepted write that did exactly what w says.
func checkApplied(t *testing.T, r *report, w applied) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Errorf("%s: "+format+"\n%s", append(append([]any{r.Case}, args...), r.line)...)
	}
	if r.Error != nil {
		fail("write refused or failed under the caller's own locks: code %v %v: %s", derefInt(r.Error.Code), deref(r.Error.CodeName), r.Error.Errmsg)
		return
	}
	before, err1 := parseSnapshot(r.Before)
	after, err2 := parseSnapshot(r.After)
	if err1 != nil || err2 != nil {
		fail("snapshots do not parse: %v %v", err1, err2)
		return
	}
	want := map[string]change{}
	for id, c := range w.changes {
		want[idKey(id)] = c
	}
	keys := map[string]bool{}
	for k := range before {
		keys[k] = true
	}
	for k := range after {
		keys[k] = true
	}
	for k := range keys {
		b, a := before[k], after[k]
		c, expected := want[k]
		switch {
		case !expected:
			if !bytes.Equal(b, a) {
				fail("document _id %s changed, and this write must not touch it:\nbefore %v\nafter  %v", k, b, a)
			}
		case c.deleted:
			if b == nil || a != nil {
				fail("document _id %s: want it deleted (before %v, after %v)", k, b, a)
			}
		case a == nil:
			fail("document _id %s is missing after the write", k)
		case c.exact != nil:
			wantDoc, err := bson.Marshal(c.exact)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, wantDoc) {
				fail("document _id %s is %v, want exactly %v", k, a, bson.Raw(wantDoc))
			}
		default:
			for _, f := range c.fields {
				got, err := a.LookupErr(f.Key)
				if err != nil || !sameValue(got, f.Value) {
					fail("document _id %s: field %s = %v, want %v (document %v)", k, f.Key, got, f.Value, a)
				}
			}
		}
	}
	for k := range want {
		if !keys[k] {
			fail("document _id %s is in neither snapshot", k)
		}
	}
	if len(w.counts) == 0 && w.upserted == nil && w.returned == nil {
		return
	}
	res, err := parseDoc(deref(r.Result))
	if err != nil {
		fail("result does not parse: %v", err)
		return
	}
	for k, n := range w.counts {
		v, err := res.LookupErr(k)
		if err != nil {
			fail("result has no %s count", k)
			continue
		}
		if got, ok := v.AsInt64OK(); !ok || got != n {
			fail("result %s = %v, want %d", k, v, n)
		}
	}
	if w.upserted != nil {
		if v, err := res.LookupErr("upsertedId"); err != nil || !sameValue(v, w.upserted) {
			fail("result upsertedId = %v, want %v", v, w.upserted)
		}
	}
	if w.returned != nil {
		doc, ok := res.Lookup("doc").DocumentOK()
		if !ok {
			fail("no document returned, want _id %v", w.returned)
		} else if id, err := doc.LookupErr("_id"); err != nil || !sameValue(id, w.returned) {
			fail("returned document %v, want _id %v", doc, w.returned)
		}
	}
}

func parseDoc(ejson string) (bson.Raw, error) {
	if ejson == "" {
		return nil, fmt.Errorf("empty")
	}
	var raw bson.Raw
	if err := bson.UnmarshalExtJSON([]byte(ejson), true, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// parseSnapshot reads {docs: [...]} into the documents by _id key.
func parseSnapshot(ejson string) (map[string]bson.Raw, error) {
	var s struct {
		Docs []bson.Raw `bson:"docs"`
	}
	if err := bson.UnmarshalExtJSON([]byte(ejson), true, &s); err != nil {
		return nil, err
	}
	out := map[string]bson.Raw{}
	for _, d := range s.Docs {
		id, err := d.LookupErr("_id")
		if err != nil {
			return nil, fmt.Errorf("document without _id: %v", d)
		}
		out[rawKey(id)] = d
	}
	return out, nil
}

// snapshotIDs lists a snapshot's _ids (integers as decimal text), in order.
func snapshotIDs(t *testing.T, ejson string) []string {
	t.Helper()
	var s struct {
		Docs []bson.Raw `bson:"docs"`
	}
	if err := bson.UnmarshalExtJSON([]byte(ejson), true, &s); err != nil {
		t.Fatalf("snapshot does not parse: %v", err)
	}
	var ids []string
	for _, d := range s.Docs {
		ids = append(ids, rawKey(d.Lookup("_id")))
	}
	return ids
}

// checkNoOracle asserts that a refusal of a write whose filter names no
// _id reveals no _id and no holder: the client learns how many documents
// it would need to lock, never which ones match a filter it chose.
func checkNoOracle(t *testing.T, r *report, holderApp string) {
	t.Helper()
	if ids := detailIDs(t, r); len(ids) != 0 {
		t.Errorf("%s: the refusal names ids %v that the request did not name: %s", r.Case, ids, r.line)
	}
	if holderApp != "" && strings.Contains(r.Error.Errmsg, holderApp) {
		t.Errorf("%s: the refusal names the holder of a document the request did not name: %s", r.Case, r.Error.Errmsg)
	}
	if strings.Contains(r.Error.Errmsg, "_id") {
		t.Errorf("%s: the refusal shows an _id the request did not name: %s", r.Case, r.Error.Errmsg)
	}
}

// detailIDs lists the ids of a refusal's detail, like snapshotIDs.
func detailIDs(t *testing.T, r *report) []string {
	t.Helper()
	detail, err := parseDoc(deref(r.Error.Detail))
	if err != nil {
		return nil
	}
	arr, ok := detail.Lookup("ids").ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return nil
	}
	var ids []string
	for _, v := range vals {
		ids = append(ids, rawKey(v))
	}
	return ids
}

// rawKey names an _id: integers as decimal text (every driver here sends
// small integers as int32), anything else as its extended JSON.
func rawKey(v bson.RawValue) string {
	if v.Type == bson.TypeInt32 {
		return fmt.Sprint(v.Int32())
	}
	return v.String()
}

func idKey(id int32) string { return fmt.Sprint(id) }

// sameValue compares a BSON value with a Go value by type and bytes.
func sameValue(got bson.RawValue, want any) bool {
	typ, data, err := bson.MarshalValue(want)
	if err != nil {
		return false
	}
	return got.Type == typ && bytes.Equal(got.Value, data)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// metricValue sums the counters and gauges of the gateway's registry named
// name whose labels include labels; a series never created reads as 0.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := gw.Registry().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			match := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					match++
				}
			}
			if match != len(labels) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return sum
	}
	// A vector with no series yet is not gathered at all.
	return 0
}

// checkLockReply asserts a renewLock (status false) or lockStatus (status
// true) reply over n ids: unchanged collection, n locks, each with a token
// (renew) or held by the caller (status).
func checkLockReply(t *testing.T, r *report, n int64, status bool) {
	t.Helper()
	checkSetup(t, r, -1)
	if r == nil || r.Error != nil {
		return
	}
	res, err := parseDoc(deref(r.Result))
	if err != nil {
		t.Errorf("%s: reply does not parse: %v", r.Case, err)
		return
	}
	arr, ok := res.Lookup("locks").ArrayOK()
	vals, verr := arr.Values()
	if !ok || verr != nil || int64(len(vals)) != n {
		t.Errorf("%s: want %d locks in the reply: %s", r.Case, n, r.line)
		return
	}
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			t.Errorf("%s: a lock that is not a document: %s", r.Case, r.line)
			return
		}
		if status {
			if you, _ := d.Lookup("heldByYou").BooleanOK(); !you {
				t.Errorf("%s: a lock not held by the caller: %v", r.Case, d)
			}
		} else if tok, ok := d.Lookup("token").AsInt64OK(); !ok || tok <= 0 {
			t.Errorf("%s: a renewed lock without a token: %v", r.Case, d)
		}
	}
}
