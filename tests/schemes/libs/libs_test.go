package libs

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
)

// The common locking libraries whose own flows libs.py and libs.js
// translate call for call (the file of each library is named in the
// scripts), and the name config.example.yaml's "Library presets" gives
// each. Their namespaces are the databases lib_<name> and, for each
// driver's takeover, libtk_<driver>_<name> (takeoverDB); libdirect_<name>,
// libcontrol_<name> and directlibtk_<driver>_<name> have no rule.
var libPresets = []struct{ name, label string }{
	{"mongolocks", "mizrael/MongoLocks"},
	{"drmirror", "drmirror/locks"},
	{"alistair", "alistairjevans/mongodb-locks"},
	{"tharga", "Tharga.MongoDB"},
	{"codecentric", "codecentric"},
}

// examplePath is config.example.yaml, from this package's directory.
const examplePath = "../../../config.example.yaml"

// libScheme is the library's preset as config.example.yaml writes it (the
// "scheme:" line under the library's name), parsed as the configuration
// file is (unknown keys are an error), with a lease scaled down to the
// tests' libLeaseMS where the preset sets one.
func libScheme(name string) (*config.Scheme, error) {
	label := ""
	for _, p := range libPresets {
		if p.name == name {
			label = p.label
		}
	}
	if label == "" {
		return nil, fmt.Errorf("no preset for %s", name)
	}
	src, err := os.ReadFile(examplePath)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(src), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "#   "+label+" ") || i+1 == len(lines) {
			continue
		}
		next := strings.TrimSpace(lines[i+1])
		preset, ok := strings.CutPrefix(next, "#     scheme: ")
		if !ok {
			return nil, fmt.Errorf("%s: the line after %q is %q, not a scheme", examplePath, l, next)
		}
		dec := yaml.NewDecoder(strings.NewReader(preset))
		dec.KnownFields(true)
		var s config.Scheme
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("preset %s: %w", preset, err)
		}
		if s.LeaseMS != 0 {
			s.LeaseMS = libLeaseMS
		}
		return &s, nil
	}
	return nil, fmt.Errorf("%s has no preset for %s", examplePath, label)
}

// libRules are the enforced namespaces of the library tests. A preset
// that does not parse is left out here and reported by the library's
// tests, so that they say so instead of running under no rule.
func libRules() []config.NamespaceRule {
	var rs []config.NamespaceRule
	for _, p := range libPresets {
		if s, err := libScheme(p.name); err == nil {
			rs = append(rs, config.NamespaceRule{Match: "lib_" + p.name + ".*", Mode: config.ModeEnforce, Scheme: s})
			for _, d := range libDrivers() {
				rs = append(rs, config.NamespaceRule{Match: takeoverDB(d, p.name) + ".*", Mode: config.ModeEnforce, Scheme: s})
			}
		}
	}
	return rs
}

var libNames = []string{"mongolocks", "drmirror", "alistair", "tharga", "codecentric"}

type libWorkResult struct {
	workResult
	Setup map[string]any `json:"setup"`
	// Rollback is what Tharga's LockManyAsync rollbacks met: the library
	// swallows their errors, the scripts count them (libs.py,
	// new_rollback). Writes is how many it made; Refused (by codeName)
	// and Failed (by error) those that failed while their lock had more
	// than lockgate's margin left, Expired those that failed after it
	// might not have (a lease lost to load: not judged).
	Rollback struct {
		Writes  int            `json:"writes"`
		Refused map[string]int `json:"refused"`
		Failed  map[string]int `json:"failed"`
		Expired map[string]int `json:"expired"`
	} `json:"rollback"`
}

func needLib(t *testing.T, d libDriver, lib string) {
	t.Helper()
	// Always a failure, not testkit.RequireTool's skip: these flows are
	// the proof that the libraries' locks hold with real drivers.
	if err := d.missing(); err != nil {
		t.Fatal(err)
	}
	if _, err := libScheme(lib); err != nil {
		t.Fatalf("the rule of lib_%s is not configured: %v", lib, err)
	}
}

// libRaceAnswers are answers of the database that the direct run, a
// sample, may not show: DuplicateKey to one of two inserts or upserts of
// the same _id racing, which each of these libraries catches by name as
// "not acquired" (MongoDB documents it for concurrent upserts); Tharga's
// busy pick (its findOneAndUpdate on a document whose Lock is set matches
// nothing: null) and the rollback of a LockManyAsync that met one. The
// direct runs of Tharga end a worker at the library's own races (its
// InvalidOperation without lockgate), so a run may stop before its
// workers contend (CI saw both missing from the two direct runs once).
var libRaceAnswers = map[string][]string{
	"mongolocks":  {"lock:DuplicateKeyError/11000"},
	"alistair":    {"attempt:DuplicateKeyError/11000", "attempt:OperationFailure/11000"},
	"codecentric": {"obtain:DuplicateKeyError/11000"},
	"tharga":      {"acquire:null", "lockMany:LockException"},
}

// libWant is what the counters must end at: every worker adds one per
// round to the document of the round (Tharga: two documents, through
// LockManyAsync, on odd rounds). Workers 0 and 1 want the same document
// in every round, so that the run always has contention.
func libWant(lib string, base int) map[string]int64 {
	key := func(n int) string {
		if lib == "alistair" {
			return "r" + itoa(base+1+n)
		}
		return itoa(base + 1 + n)
	}
	want := map[string]int64{}
	for w := 0; w < workers; w++ {
		for i := 0; i < increments; i++ {
			want[key((w/2+i)%3)]++
			if lib == "tharga" && i%2 == 1 {
				want[key((w/2+i+1)%3)]++
			}
		}
	}
	return want
}

// The libraries run beside each other, each in its own databases; the
// drivers of one library one after the other, since both use the same
// lock records' holder names (codecentric's releaseAll by aid). The
// workload and the takeover are not beside each other: they use the same
// databases and document ids.

// TestLibWorkload: each library's own flow, unchanged, K workers through
// both proxies while a rogue writes around the lock: counters end at
// exactly K x M, no rogue write lands, and every return value a worker's
// library call saw through lockgate has the shape it has when the same
// flow runs straight at the database. The control (straight at the
// database, with the rogue) shows the rogue's writes landing.
//
// The libraries take their CPU slots longest first (libWorkloadOrder,
// twoproxies.Turns): Tharga's, about half the phase, had often started
// last and run alone at the end.
func TestLibWorkload(t *testing.T) {
	if !slices.Equal(slices.Sorted(slices.Values(libWorkloadOrder)), slices.Sorted(slices.Values(libNames))) {
		t.Fatalf("libWorkloadOrder %v is not libNames %v", libWorkloadOrder, libNames)
	}
	slots := testkit.CPUSlots()
	turns := twoproxies.NewTurns(len(libWorkloadOrder))
	for i, lib := range libWorkloadOrder {
		ran := false
		t.Run(lib, func(t *testing.T) {
			ran = true
			t.Parallel()
			turns.Take(t, i, slots)
			for _, d := range libDrivers() {
				t.Run(d.name, func(t *testing.T) {
					needLib(t, d, lib)
					libWorkload(t, d, lib)
				})
			}
		})
		if !ran {
			turns.Pass(i)
		}
	}
}

// libWorkloadOrder is libNames, the longest workload first.
var libWorkloadOrder = []string{"tharga", "drmirror", "codecentric", "mongolocks", "alistair"}

func libWorkload(t *testing.T, d libDriver, lib string) {
	k, m := itoa(workers), itoa(increments)
	var proxied libWorkResult
	runLib(t, d, &proxied, lib, "work", proxyURI+","+proxy2URI, directURI, "lib_"+lib, itoa(d.base), k, m, "1")
	t.Logf("through lockgate: %+v", proxied)
	want := libWant(lib, d.base)
	for id, n := range want {
		if proxied.Counters[id] != n {
			t.Errorf("through lockgate, counter of _id %s = %d, want %d (lost or foreign writes)", id, proxied.Counters[id], n)
		}
	}
	if len(proxied.Counters) != len(want) {
		t.Errorf("through lockgate, documents %v, want %d (a rogue delete landed?)", proxied.Counters, len(want))
	}
	if proxied.RogueLanded["update"]+proxied.RogueLanded["delete"] != 0 {
		t.Errorf("through lockgate, rogue writes landed: %v", proxied.RogueLanded)
	}
	if !slices.Equal(proxied.RogueRefused, []string{"46/LockBusy"}) {
		t.Errorf("through lockgate, rogue refusals %v, want only 46/LockBusy", proxied.RogueRefused)
	}
	if len(proxied.Errors) > 0 || slices.Contains(proxied.Outcomes, "write:not_applied") {
		t.Errorf("through lockgate, the library failed: %v %v", proxied.Errors, proxied.Outcomes)
	}
	// A rollback's write is its holder's release of a lock it holds:
	// refused, it would leave the lock held until it expires, and the
	// library would never say (it swallows the error).
	if rb := proxied.Rollback; len(rb.Refused)+len(rb.Failed) > 0 {
		t.Errorf("through lockgate, of %d rollback writes of LockManyAsync, refused %v, failed %v (expired, not judged: %v)", rb.Writes, rb.Refused, rb.Failed, rb.Expired)
	}

	// The same workload straight at the database, without the rogue and,
	// as the control, with it, the two at once (each in its own database,
	// a few seconds each): the run through lockgate, whose workers must
	// finish within their leases, had the slot alone.
	var direct, control libWorkResult
	runLibs(t, d,
		libRun{&direct, []string{lib, "work", directURI, directURI, "libdirect_" + lib, itoa(d.base), k, m, "0"}},
		libRun{&control, []string{lib, "work", directURI, directURI, "libcontrol_" + lib, itoa(d.base), k, m, "1"}})
	t.Logf("direct, no rogue: %+v", direct)
	busy := 0
	for _, o := range proxied.Outcomes {
		if strings.Contains(o, "11000") || strings.Contains(o, "modified=0") || strings.Contains(o, "LockException") ||
			strings.HasPrefix(o, "attempt:doc(") {
			busy++
		}
	}
	if busy == 0 {
		t.Errorf("through lockgate, no worker ever found a lock busy (%v): the workload has no contention", proxied.Outcomes)
	}

	t.Logf("direct with rogue (control): %+v", control)
	if control.RogueLanded["update"]+control.RogueLanded["delete"] == 0 {
		t.Errorf("control: no rogue write landed straight at the database: %+v", control)
	}
	// Every return value the library saw through lockgate is one the
	// database itself gives to the same calls. Both direct runs are the
	// database's answers; a contended outcome (a busy pick's null, a
	// failed lockMany) may happen to be missing from one sample of them.
	seen := slices.Concat(direct.Outcomes, control.Outcomes)
	for _, o := range proxied.Outcomes {
		if !slices.Contains(seen, o) && !slices.Contains(libRaceAnswers[lib], o) {
			t.Errorf("return value %q seen through lockgate was never seen directly (%v)", o, seen)
		}
	}
}

// TestLibSetup: a library's own setup (the TTL and aid indexes of the lock
// collection) gets through lockgate the answer the database gives it.
// The two libraries, in databases of their own, and the two runs of a
// case (through lockgate and straight at the database, each in its own
// database) run at once: a case is two script start-ups and a few index
// calls. The drivers of one library stay one after the other, the
// second meeting the indexes the first created, as before.
func TestLibSetup(t *testing.T) {
	for _, lib := range []string{"alistair", "codecentric"} {
		t.Run(lib, func(t *testing.T) {
			t.Parallel()
			for _, d := range libDrivers() {
				t.Run(d.name, func(t *testing.T) {
					needLib(t, d, lib)
					var proxied, direct map[string]any
					runLibs(t, d,
						libRun{&proxied, []string{lib, "setup", proxyURI, directURI, "lib_" + lib, itoa(d.base)}},
						libRun{&direct, []string{lib, "setup", directURI, directURI, "libdirect_" + lib, itoa(d.base)}})
					if fmt.Sprint(proxied) != fmt.Sprint(direct) {
						t.Errorf("setup through lockgate %v, straight at the database %v", proxied, direct)
					}
				})
			}
		})
	}
}

// TestLibTakeover: a holder takes a lock and vanishes; the lock is taken
// over as the library expects (after LockTime's timeout, ExpireAt, the
// ExpireTime of the Lock, the TTL, or a flag cleared once its holder has
// been silent for the lease), also where the database has no TTL monitor;
// the vanished holder's late calls change nothing. Where the library's
// own calls already decide every step (MongoLocks), the run through
// lockgate must return exactly what the same run returns straight at the
// database.
//
// Every case, library by driver, runs at once (TestMain's
// testkit.DefaultParallel), each driver in databases of its own
// (takeoverDB): a case is a few calls and lease-long waits. In the
// libraries' shared databases the drivers had to take turns (a seed
// empties the collections, codecentric's release of all a holder's
// records would take the other driver's).
func TestLibTakeover(t *testing.T) {
	for _, lib := range libNames {
		t.Run(lib, func(t *testing.T) {
			t.Parallel()
			for _, d := range libDrivers() {
				t.Run(d.name, func(t *testing.T) {
					t.Parallel()
					needLib(t, d, lib)
					libTakeover(t, d, lib)
				})
			}
		})
	}
}

// takeoverDB is the database of a driver's takeover of lib through
// lockgate; "direct"+takeoverDB its run straight at the database.
func takeoverDB(d libDriver, lib string) string { return "libtk_" + d.name + "_" + lib }

func libTakeover(t *testing.T, d libDriver, lib string) {
	// The same run straight at the database, which only MongoLocks is
	// compared with (the others' runs through lockgate are refused where
	// the database would let the vanished holder through, which want
	// says), beside the run through lockgate: the others' direct runs
	// were only logged, and waited out their leases for nothing.
	var got, direct map[string]any
	runs := []libRun{{&got, []string{lib, "takeover", proxyURI, directURI, takeoverDB(d, lib), itoa(d.base)}}}
	if lib == "mongolocks" {
		runs = append(runs, libRun{&direct, []string{lib, "takeover", directURI, directURI, "direct" + takeoverDB(d, lib), itoa(d.base)}})
	}
	runLibs(t, d, runs...)
	t.Logf("through lockgate: %v", got)
	const refused = "refused/46"
	var want map[string]any
	switch lib {
	case "mongolocks":
		want = map[string]any{"a_lock": "locked", "b_lock_early": "LockException", "b_lock_after_lease": "locked",
			"a_release_after_takeover": "LockException", "b_release": "released", "c_lock_new": "locked",
			"c_release_new": "released", "new_value": 6, "final": 7}
		t.Logf("direct: %v", direct)
		if fmt.Sprint(got) != fmt.Sprint(direct) {
			t.Errorf("through lockgate %v, straight at the database %v", got, direct)
		}
	case "drmirror":
		want = map[string]any{"a_lock": true, "b_lock_early": false, "b_unlock_early": refused,
			"b_unlock_after_lease": 1, "b_lock": true, "a_write_after_takeover": refused,
			"a_unlock_after_takeover": refused, "b_write": 1, "b_unlock": 1, "final": 7}
	case "alistair":
		want = map[string]any{"a_acquire": true, "b_acquire_early": false, "b_acquire_after_expiry": true,
			"a_write_after_takeover": refused, "a_dispose_after_takeover": refused, "b_write": 1, "b_dispose": 1,
			"a_acquire_after_release": true, "final": 7}
	case "tharga":
		want = map[string]any{"a_pick": "picked", "b_pick_early": "LockException", "b_pick_after_expiry": "picked",
			"a_commit_after_takeover": "LockExpiredException", "a_abandon_after_takeover": refused,
			"b_commit": true, "final": 7,
			"a_pick_2": "picked", "a_error_state": false, "b_pick_error": "LockErrorException",
			"b_pick_error_after_expiry": "LockErrorException", "b_release_exception": "doc(Counter,Lock,_id)",
			"b_pick_after_release": "picked", "b_commit_2": true,
			"a_pick_4": "picked", "b_pick_group": "picked:5", "b_commit_group": true, "a_commit_4": true,
			"a_pick_7": "picked", "b_lock_many_busy": "LockException", "lock_6_after_rollback": true,
			"a_commit_7": true, "b_lock_many": 2, "final_4_5_6_7": []int{1, 1, 10, 11}}
	case "codecentric":
		want = map[string]any{"a_obtain": true, "b_obtain_early": false, "b_release_early": refused,
			"b_obtain_after_ttl": true, "a_write_after_takeover": refused, "b_write": 1,
			"a_release_all_after_takeover": 0, "b_release_all": 1, "a_obtain_after_release": true, "final": 7}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if fmt.Sprint(got[k]) != fmt.Sprint(want[k]) {
			t.Errorf("%s = %v, want %v", k, got[k], want[k])
		}
	}
}
