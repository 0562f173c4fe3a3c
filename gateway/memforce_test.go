package gateway

import (
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// TestForceReleaseOfAMemoryLock: a lone lockgate holds a legacy write's
// implicit lock in memory (taken with the guard's own call, as for a
// write that has not left yet, or whose release was lost). /locks lists
// it; an operator force-releases it by the key the console sends. The
// lock has no fencing token and its write may land until the lock's end,
// so the force-release must neither report it free while it is listed
// (the bug: 404 "no lock is held") nor end it early, which would grant
// the next acquirer while the write can still land: it answers once the
// lock has ended, naming the holder it waited for, and only then is the
// key free for acquireLock and gone from /locks.
func TestForceReleaseOfAMemoryLock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	const token = "s3cret-operator-token"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.AdminAuth.TokenFile = secretFile(t, token+"\n")
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedWait}}
	gw := startGateway(t, cfg)
	admin := gw.admin
	client, sctx := gw.session(t, "editor")

	id, err := docid.Of(int32(42))
	if err != nil {
		t.Fatal(err)
	}
	session := make([]byte, 16)
	_, _ = rand.Read(session)
	owner := lockstore.Owner{Session: session, App: "legacy-batch", Client: "10.0.0.9:5000", Implicit: "update"}
	var (
		taken  time.Time
		budget time.Duration
	)
	testkit.Eventually(t, 10*time.Second, "the lone lockgate holds an implicit lock in memory", func() bool {
		taken = time.Now()
		var ok bool
		_, budget, ok = gw.store.AcquireInMemory(owner, namespace.Of("shop.orders"), []docid.ID{id})
		return ok
	})
	// The lock's write may land until then, at the earliest.
	ends := taken.Add(budget)

	code, body := httpGet(t, admin+"/locks")
	var view struct {
		Locks []lockView `json:"locks"`
	}
	if err := json.Unmarshal([]byte(body), &view); code != 200 || err != nil || len(view.Locks) != 1 || !view.Locks[0].Implicit ||
		view.Locks[0].Holder == nil || view.Locks[0].Holder.App != "legacy-batch" {
		t.Fatalf("/locks = %d %s, want the memory lock", code, body)
	}
	key := view.Locks[0].Key

	type answer struct {
		code int
		body string
		at   time.Time
	}
	released := make(chan answer, 1)
	go func() {
		req, _ := json.Marshal(map[string]string{"namespace": "shop.orders", "key": key, "reason": "stuck legacy write"})
		code, body := post(t, admin+"/locks/release", token, string(req))
		released <- answer{code, body, time.Now()}
	}()
	// An acquirer meanwhile is refused, or granted only once the write
	// under the memory lock can no longer land.
	acqErr := client.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Err()
	if acqErr == nil {
		if now := time.Now(); now.Before(ends) {
			t.Fatalf("acquireLock granted %v before the memory lock's write could have ended", ends.Sub(now))
		}
		if _, err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "releaseLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Raw(); err != nil {
			t.Fatal(err)
		}
	} else if !strings.Contains(acqErr.Error(), "legacy-batch") {
		t.Fatalf("acquireLock during the force-release: %v, want LockBusy naming the memory lock's holder", acqErr)
	}

	a := <-released
	if a.code != http.StatusOK || !strings.Contains(a.body, `"released": true`) || !strings.Contains(a.body, `"app": "legacy-batch"`) {
		t.Fatalf("force-release of a memory lock listed by /locks: %d %s, want 200, released, naming its holder", a.code, a.body)
	}
	if a.at.Before(ends) {
		t.Fatalf("the force-release answered %v before the memory lock's write could have ended: it ended the lock under a write that may still land", ends.Sub(a.at))
	}
	if code, body := httpGet(t, admin+"/locks"); code != 200 || strings.Contains(body, "legacy-batch") {
		t.Fatalf("/locks after the force-release: %d %s, want the memory lock gone", code, body)
	}
	var st bson.M
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "lockStatus", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if held := st["locks"].(bson.A)[0].(bson.M)["held"]; held != false {
		t.Fatalf("lockStatus after the force-release: %v, want not held", st)
	}
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Err(); err != nil {
		t.Fatalf("acquireLock after the force-release: %v", err)
	}
}
