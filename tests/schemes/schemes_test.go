package schemes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
)

// Workload size: K workers, M increments each, per hot document set.
// Workers 0 and 1 want the same document in every round (lockDocument:
// every worker wants document 3 in every round), so that any run
// contends: 8 rounds show what 20 did (docs/TESTING.md, tenth round) at
// under half the calls through lockgate, which are the workloads' time.
const (
	workers    = 3
	increments = 8
)

var schemeNames = []string{"holderFields", "lockDocument", "flag", "lockCollection"}

// workloadOrder is schemeNames, the longest workload first.
var workloadOrder = []string{"lockDocument", "lockCollection", "holderFields", "flag"}

type workResult struct {
	Counters     map[string]int64 `json:"counters"`
	RogueLanded  map[string]int   `json:"rogueLanded"`
	RogueRefused []string         `json:"rogueRefused"`
	Outcomes     []string         `json:"outcomes"`
	Errors       []string         `json:"errors"`
	// LeaseLost is how long (ms from the send of its acquire) each flag
	// holder whose call was refused may have held its lock, when that
	// reached the lease less lockgate's margin: the lock may have ended
	// before the call, so the run is not judged, and the workers stopped
	// (schemes.py, work).
	LeaseLost []int64 `json:"leaseLost"`

	// RogueTakeovers is the age (ms, at the reply) of each lock record
	// the rogue deleted that was past its lease: abandoned, which the
	// scheme lets anyone delete (a worker slowed past its lease by a
	// loaded machine leaves one). RogueStolen: the age of each it deleted
	// within its lease, counted in RogueLanded.
	RogueTakeovers []int64 `json:"rogueTakeovers"`
	RogueStolen    []int64 `json:"rogueStolen"`

	// Tries is how many acquires the workers sent (one per try of a
	// busy lock too), RogueTries how many writes the rogue sent: the
	// calls a run costs, for the log.
	Tries      int `json:"tries"`
	RogueTries int `json:"rogueTries"`

	// Took is how long the script ran.
	Took time.Duration `json:"-"`
}

// A client that runs the schemes' flows: the same script in each.
type driver struct {
	name string
	// missing says how to install it, nil when it is there.
	missing func() error
	argv    []string
}

var drivers = []driver{
	{
		name:    "pymongo",
		missing: testkit.Pymongo,
		argv:    []string{"/usr/bin/python3", "pymongo/schemes.py"},
	},
	{
		name:    "node",
		missing: func() error { return testkit.NodeModule("../compat/node/node_modules", "mongodb") },
		argv:    []string{"node", "node/schemes.js"},
	},
}

func need(t *testing.T, d driver) {
	t.Helper()
	// Always a failure, not testkit.RequireTool's skip: these flows are
	// the proof that the schemes work with real drivers.
	if err := d.missing(); err != nil {
		t.Fatal(err)
	}
}

func runScript(t *testing.T, d driver, args ...string) []byte {
	t.Helper()
	return runScriptLease(t, d, leaseMS, args...)
}

// runScriptLease is runScript with the lease the script is to use.
func runScriptLease(t *testing.T, d driver, ms int64, args ...string) []byte {
	t.Helper()
	// 90 s on an idle machine; the scripts wait out leases, which scale.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second*time.Duration(ms/baseLeaseMS))
	defer cancel()
	out, err := twoproxies.RunScript(ctx, ms, d.argv, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A run of the workload script: the database (each driver in its own
// collection of it), the URI it goes through, whether the rogue runs.
type workRun struct {
	uri, db string
	rogue   bool
}

// work runs the workload script once per run, all at once, under lease
// ms, and returns their results in the same order.
func work(t *testing.T, d driver, scheme string, ms int64, runs ...workRun) []workResult {
	t.Helper()
	// 90 s on an idle machine; the scripts wait out leases, which scale.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second*time.Duration(ms/baseLeaseMS))
	defer cancel()
	res := make([]workResult, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			start := time.Now()
			defer func() { res[i].Took = time.Since(start).Round(time.Millisecond) }()
			rogue := "0"
			if r.rogue {
				rogue = "1"
			}
			out, err := twoproxies.RunScript(ctx, ms, d.argv, scheme, "work", r.uri, directURI, r.db, d.name, itoa(workers), itoa(increments), rogue)
			if err == nil {
				if err = json.Unmarshal(out, &res[i]); err != nil {
					err = fmt.Errorf("%s output %q: %w", d.argv[len(d.argv)-1], out, err)
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return res
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestSchemeWorkload: K workers increment hot documents under each
// scheme through two proxies in front of the same database while a rogue
// client writes around the scheme.
// Every increment lands exactly once, no rogue write lands (each is
// refused with LockBusy), and the workers' lock calls see only the
// scheme's own signals. The control runs the same workload straight at
// FerretDB and must show the rogue's writes landing.
//
// The schemes run beside each other (each in its own databases), one per
// CPU (testkit.CPUSlots): their workers spin through lock calls. The
// drivers of one scheme run one after the other. They take their slots
// longest first (workloadOrder): taken in whatever order go resumed them,
// lockDocument's, about half the phase, often started last and ran alone
// at the end (twoproxies.Turns).
func TestSchemeWorkload(t *testing.T) {
	t.Parallel()
	// Not beside the tests that wait on clocks and leases (waitPhase):
	// all four takeovers beside two workloads starved the lock store on a
	// loaded machine, and the model saw a violation beside them
	// (docs/TESTING.md, second round).
	waitPhase.wait()
	if !slices.Equal(slices.Sorted(slices.Values(workloadOrder)), slices.Sorted(slices.Values(schemeNames))) {
		t.Fatalf("workloadOrder %v is not schemeNames %v", workloadOrder, schemeNames)
	}
	slots := testkit.CPUSlots()
	turns := twoproxies.NewTurns(len(workloadOrder))
	for i, scheme := range workloadOrder {
		ran := false
		t.Run(scheme, func(t *testing.T) {
			ran = true
			t.Parallel()
			turns.Take(t, i, slots)
			for _, d := range drivers {
				t.Run(d.name, func(t *testing.T) {
					need(t, d)
					workload(t, d, scheme)
				})
			}
		})
		if !ran {
			// Left out by -run: its turn passes to the next.
			turns.Pass(i)
		}
	}
}

func workload(t *testing.T, d driver, scheme string) {
	// Expected counter per document: every worker adds one to each
	// of its documents per round.
	want := map[string]int64{}
	switch scheme {
	case "lockDocument":
		// Rounds alternate documents 1 and 2, always with 3.
		for w := 0; w < workers; w++ {
			for i := 0; i < increments; i++ {
				want[itoa(1+(w+i)%2)]++
				want["3"]++
			}
		}
	default:
		// Workers 0 and 1 share a document in every round.
		for w := 0; w < workers; w++ {
			for i := 0; i < increments; i++ {
				want[itoa(1+(w/2+i)%3)]++
			}
		}
	}
	// A run in which a flag holder was slowed past its lease (LeaseLost)
	// is run again, in a database of its own, under a longer lease, as
	// the takeovers are: its flag stays set, and a run judged that way
	// failed with a peer waiting 120 s for it (docs/TESTING.md, issue 25).
	var proxied workResult
	for attempt, k := range leaseScales {
		proxied = work(t, d, scheme, leaseMS*k, workRun{proxyURI + "," + proxy2URI, scaledDB(scheme, k), true})[0]
		t.Logf("through lockgate, lease %d ms: %+v", leaseMS*k, proxied)
		if len(proxied.LeaseLost) == 0 {
			break
		}
		if attempt == len(leaseScales)-1 {
			t.Fatalf("in %d runs a flag holder's call was refused after it may have held its lock for its whole lease (held %v ms, lease %d ms): the machine is too slow to judge the workload (raise %s)",
				attempt+1, proxied.LeaseLost, leaseMS*k, testkit.LeaseScaleEnv)
		}
		t.Logf("run %d: a flag holder's call was refused after it may have held its lock for its whole lease (held %v ms of %d ms); it is not judged, and the workload runs again under a lease %d times as long",
			attempt+1, proxied.LeaseLost, leaseMS*k, leaseScales[attempt+1]/k)
	}
	for id, n := range want {
		if proxied.Counters[id] != n {
			t.Errorf("through lockgate, counter of _id %s = %d, want %d (lost or foreign writes)", id, proxied.Counters[id], n)
		}
	}
	if len(proxied.Counters) != len(want) {
		t.Errorf("through lockgate, documents %v, want %d (a rogue delete landed?)", proxied.Counters, len(want))
	}
	if proxied.RogueLanded["update"]+proxied.RogueLanded["delete"] != 0 {
		t.Errorf("through lockgate, rogue writes landed: %v (ages in ms of the live lock records deleted: %v)", proxied.RogueLanded, proxied.RogueStolen)
	}
	if !slices.Equal(proxied.RogueRefused, []string{"46/LockBusy"}) {
		t.Errorf("through lockgate, rogue refusals %v, want only 46/LockBusy", proxied.RogueRefused)
	}
	if len(proxied.Errors) > 0 || slices.Contains(proxied.Outcomes, "write:not_applied") {
		t.Errorf("through lockgate, workers failed: %v %v", proxied.Errors, proxied.Outcomes)
	}

	// The same workload, no rogue, straight at the database: the
	// outcomes the workers see there are the ones they see through
	// lockgate. Beside it, in databases of their own, the control: the
	// rogue's writes land without lockgate. The two go straight to the
	// database and take a few seconds each; the run through lockgate,
	// whose workers must finish within their leases, had the slot alone.
	both := work(t, d, scheme, leaseMS, workRun{directURI, "schdirect_" + scheme, false}, workRun{directURI, "schcontrol_" + scheme, true})
	direct, control := both[0], both[1]
	t.Logf("direct, no rogue: %+v", direct)
	// Both direct runs are the database's answers; an answer to a call
	// that lost a race (duplicateKeyBusy) may be missing from one short
	// sample of them.
	seen := slices.Concat(direct.Outcomes, control.Outcomes)
	for _, o := range proxied.Outcomes {
		if !slices.Contains(seen, o) && !duplicateKeyBusy(o) {
			t.Errorf("outcome %q seen through lockgate was never seen directly (%v)", o, seen)
		}
	}
	busy := 0
	for _, o := range proxied.Outcomes {
		// lockCollection's upsert that did not insert (a live record,
		// or a racing upsert) is its busy answer too; a short run may
		// meet only that one (a run of 8 rounds did).
		if strings.Contains(o, "busy") || strings.Contains(o, "modified=0") ||
			strings.HasPrefix(o, "acquire_upsert:matched=") || o == "acquire_upsert:duplicate" {
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
}

// duplicateKeyBusy says whether a worker's outcome is the database's
// DuplicateKey answer to an acquire that inserts (an insert, or an upsert
// whose filter does not match the locked document) while another holds
// the lock: the busy answer of holderFields and lockCollection, which a
// short direct run, whose calls rarely overlap, may not happen to meet
// (a run of 8 rounds met it through lockgate and not directly).
func duplicateKeyBusy(o string) bool {
	return o == "acquire_upsert:duplicate" || strings.HasPrefix(o, "acquire_busy:") && strings.HasSuffix(o, "/11000")
}

// TestSchemeTakeover: a holder takes a lock and vanishes; after the
// scheme's expiry (holderFields: LockTime older than the lease;
// lockDocument: expiresAt passed; flag: the holder silent for the lease,
// then the flag cleared) another client takes it over, and the vanished
// holder's late write no longer lands.
//
// The eight cases (four schemes, two drivers, each driver in a collection
// of its own) run at once (TestMain's testkit.DefaultParallel): most of
// their time is the wait for the lease to end, a few dozen calls in all.
// They run beside the model and the lock-collection tests that wait out
// leases, before the workloads (waitPhase): all four takeovers beside two
// workloads starved the lock store on a loaded machine (docs/TESTING.md).
func TestSchemeTakeover(t *testing.T) {
	waitPhase.join(t)
	t.Parallel()
	for _, scheme := range schemeNames {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			for _, d := range drivers {
				t.Run(d.name, func(t *testing.T) {
					t.Parallel()
					need(t, d)
					takeover(t, d, scheme)
				})
			}
		})
	}
}

// leaseScales are the leases of the attempts of a takeover and of a flag
// workload, in multiples of leaseMS: a run on a machine too slow for B's
// early steps to come within A's lease, or for a flag holder's calls to
// come within its own, runs again under a longer one. The scale leaseMS carries is
// read from the load once, as the package starts (testkit.LeaseScale),
// and the load can rise after that: go test ./... starts this package
// beside the race step, whose load comes later.
var leaseScales = []int64{1, 2, 4}

// scaledDB is the database of a takeover's or a workload's attempt under
// scale k of leaseMS (rules() gives each its rule; each driver has its
// own collections in it).
func scaledDB(scheme string, k int64) string {
	if k == 1 {
		return scheme
	}
	return scheme + "_x" + itoa(int(k))
}

func takeover(t *testing.T, d driver, scheme string) {
	// B's early steps (acquire, and lockCollection's delete and refresh
	// of A's record, flag's clear) must fail only while A's lock lives:
	// the script says how long they took from A's acquire (early_ms), and
	// a run in which that reached A's lease proves nothing either way
	// (under load, a non-holder's delete of a record older than the lease
	// is the TTL's recovery, allowed). Such a run is run again, each time
	// in a collection of its own, under a longer lease.
	var got map[string]any
	for attempt, k := range leaseScales {
		ms := leaseMS * k
		aLease := ms
		if scheme == "lockDocument" {
			aLease = ms * 2 / 3 // the script's lease for A
		}
		out := runScriptLease(t, d, ms, scheme, "takeover", proxyURI, directURI, scaledDB(scheme, k), d.name+"_takeover"+itoa(attempt+1))
		got = nil
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("output %q: %v", out, err)
		}
		t.Logf("%s", out)
		early, ok := got["early_ms"].(float64)
		if !ok {
			t.Fatalf("the script did not say how long its early steps took (early_ms): %s", out)
		}
		if int64(early) < aLease {
			break
		}
		if attempt == len(leaseScales)-1 {
			t.Fatalf("in %d runs B's early steps took %d ms or more from A's acquire, not less than A's lease of %d ms: A's lock may have ended before them, so the machine is too slow to judge them (raise %s)",
				attempt+1, int64(early), aLease, testkit.LeaseScaleEnv)
		}
		t.Logf("run %d: B's early steps took %d ms from A's acquire, not less than A's lease of %d ms; they are not judged, and the takeover runs again under a lease %d times as long", attempt+1, int64(early), aLease, leaseScales[attempt+1]/k)
	}
	delete(got, "early_ms")
	want := map[string]any{"a_acquire": true, "b_acquire_early": false, "final": float64(7), "b_write": float64(1)}
	switch scheme {
	case "holderFields":
		want["a_write_after_lease"] = float64(1)
		want["b_acquire_after_lease"] = true
		want["a_write_after_takeover"] = float64(0)
	case "lockDocument":
		want["a_write_after_expiry"] = float64(1)
		want["b_acquire_after_expiry"] = true
		want["a_write_after_takeover"] = float64(0)
		want["c_acquire_after_error_release"] = true
	case "lockCollection":
		want["b_acquire_upsert_early"] = false
		want["b_delete_early"] = "refused/46"
		want["b_refresh_early"] = "refused/46"
		want["b_acquire_after_ttl"] = true
		want["a_write_after_takeover"] = "refused/46"
		want["b_release_all"] = float64(1)
		want["a_acquire_after_release"] = true
	case "flag":
		want["b_clear_early"] = "refused/46"
		want["b_clear_after_lease"] = float64(1)
		want["b_acquire_after_clear"] = true
		want["a_write_after_takeover"] = "refused/46"
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
