package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestAuditTrailThroughTheGateway: two real clients write one document
// through a gateway with the trail on, one under a lock, one refused;
// the trail verifies, and the document's history in it is what happened,
// in order, with the lock holder's tag on its lock and on its writes.
func TestAuditTrailThroughTheGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	dir := filepath.Join(t.TempDir(), "trail")
	secret := "0123456789abcdef0123456789abcdef-gateway"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}
	cfg.Audit.Enabled, cfg.Audit.Dir, cfg.Audit.KeyFile, cfg.Audit.Instance = true, dir, secretFile(t, secret), "gw-1"
	const adminToken = "audit-test-operator-token"
	cfg.AdminAuth.TokenFile = secretFile(t, adminToken)
	gw := startGateway(t, cfg)
	connect := func(app string) (*mongo.Client, mongo.SessionContext) { return gw.session(t, app) }
	alpha, actx := connect("alpha")
	beta, bctx := connect("beta")
	aOrders, bOrders := alpha.Database("shop").Collection("orders"), beta.Database("shop").Collection("orders")
	lockCmd := func(c *mongo.Client, sctx context.Context, name string, ids ...any) {
		t.Helper()
		if ids == nil {
			ids = bson.A{42}
		}
		if err := c.Database("shop").RunCommand(sctx, bson.D{{Key: name, Value: "orders"}, {Key: "ids", Value: ids}}).Err(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}

	if _, err := aOrders.InsertOne(actx, bson.D{{Key: "_id", Value: 42}, {Key: "n", Value: 0}}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	lockCmd(alpha, actx, "acquireLock")
	if _, err := aOrders.UpdateOne(actx, bson.D{{Key: "_id", Value: 42}}, inc); err != nil {
		t.Fatalf("update under the lock: %v", err)
	}
	if _, err := bOrders.UpdateOne(bctx, bson.D{{Key: "_id", Value: 42}}, inc); err == nil {
		t.Fatal("beta's update of alpha's locked document was allowed")
	}
	if _, err := aOrders.UpdateOne(actx, bson.D{{Key: "_id", Value: 7}}, inc); err == nil {
		t.Fatal("an update of an unlocked document was allowed") // another document: not in 42's history
	}
	lockCmd(alpha, actx, "releaseLock")
	if _, err := bOrders.DeleteOne(bctx, bson.D{{Key: "_id", Value: 42}}); err == nil {
		t.Fatal("beta's delete without a lock was allowed")
	}
	// An operator force-releases alpha's lock on 43.
	lockCmd(alpha, actx, "acquireLock", 43)
	if code, body := post(t, gw.admin+"/locks/release", adminToken,
		`{"namespace": "shop.orders", "id": 43, "reason": "stuck job"}`); code != 200 {
		t.Fatalf("force-release: %d %s", code, body)
	}
	// The admin API answers the same history while the gateway runs, once
	// the writer has written it.
	var hist struct {
		Records   []audittrail.Record `json:"records"`
		Truncated bool                `json:"truncated"`
	}
	testkit.Eventually(t, 10*time.Second, "six records on /audit/history", func() bool {
		code, body := httpGet(t, gw.admin+"/audit/history?ns=shop.orders&id=42")
		if err := json.Unmarshal([]byte(body), &hist); code != 200 || err != nil {
			t.Fatalf("/audit/history: %d %s", code, body)
		}
		return len(hist.Records) >= 6
	})
	var apiHistory []string
	for _, r := range hist.Records {
		apiHistory = append(apiHistory, fmt.Sprintf("%s %s %s %s %s", r.Kind, r.Op, r.Verdict, r.App, r.Reason))
	}
	if code, _ := httpGet(t, gw.admin+"/audit/history"); code != 400 {
		t.Fatalf("/audit/history without a filter: %d, want 400", code)
	}
	next := *cfg
	next.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeAudit}}
	if err := gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if err := gw.stop(); err != nil {
		t.Fatal(err)
	}

	rep, err := audittrail.Verify(dir, []audittrail.Key{audittrail.NewKey([]byte(secret))})
	if err != nil || !rep.OK() {
		t.Fatalf("the gateway's trail does not verify: %v %s", err, rep.Verdict())
	}
	var got []string
	var records []*audittrail.Record
	err = audittrail.Query(dir, audittrail.Filter{NS: "shop.orders", ID: "42"}, func(r *audittrail.Record) error {
		got = append(got, fmt.Sprintf("%s %s %s %s %s", r.Kind, r.Op, r.Verdict, r.App, r.Reason))
		records = append(records, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"decision insert allow alpha ",
		"lock acquire ok alpha ",
		"decision update allow alpha ",
		"decision update reject beta held_by_other",
		"lock release ok alpha ",
		"decision delete reject beta not_locked",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("history of shop.orders 42:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Join(apiHistory, "\n") != strings.Join(want, "\n") {
		t.Fatalf("GET /audit/history of shop.orders 42:\n%s\nwant:\n%s", strings.Join(apiHistory, "\n"), strings.Join(want, "\n"))
	}
	// alpha's lock and its write under it carry the same holder tag, and
	// the lock record the token it was granted.
	if records[1].Holder == "" || records[1].Holder != records[2].Holder || records[1].Holder == records[3].Holder {
		t.Fatalf("holder tags: lock %q, write %q, beta %q", records[1].Holder, records[2].Holder, records[3].Holder)
	}
	if len(records[1].Tokens) != 1 || records[1].Tokens[0] < 1 {
		t.Fatalf("acquire record without its token: %+v", records[1])
	}
	got = nil
	audittrail.Query(dir, audittrail.Filter{NS: "shop.orders", ID: "43"}, func(r *audittrail.Record) error {
		got = append(got, fmt.Sprintf("%s %s %s %s %t", r.Kind, r.Op, r.Verdict, r.App, r.Holder == records[1].Holder))
		if r.Op == "forceRelease" && !strings.Contains(r.Detail, "stuck job") {
			t.Errorf("force-release record without the reason: %+v", r)
		}
		return nil
	})
	if strings.Join(got, "; ") != "lock acquire ok alpha true; lock forceRelease ok alpha true" {
		t.Fatalf("history of shop.orders 43: %q", got)
	}
	var kinds []string
	audittrail.Read(dir, func(r *audittrail.Record) error { kinds = append(kinds, string(r.Kind)); return nil })
	k := strings.Join(kinds, " ")
	if !strings.HasPrefix(k, "start checkpoint reload") || !strings.Contains(k, "reload") || !strings.HasSuffix(k, "stop checkpoint") {
		t.Fatalf("lifecycle records: %s", k)
	}
}

// TestAuditRequiredRefusesWhenTheTrailFails: with audit.mode required, a
// lockgate whose trail directory disappears (a file in its place: every
// new segment fails) refuses the next enforced writes with LockBusy
// audit_unavailable and writes nothing; once the directory is back,
// writes pass again and the trail verifies, with no record of a write
// that was refused for want of one claiming it was allowed after the
// refusal.
func TestAuditRequiredRefusesWhenTheTrailFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	dir := filepath.Join(t.TempDir(), "trail")
	secret := "0123456789abcdef0123456789abcdef-required"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}
	cfg.Audit.Enabled, cfg.Audit.Dir, cfg.Audit.KeyFile, cfg.Audit.Mode = true, dir, secretFile(t, secret), config.AuditRequired
	cfg.Audit.SegmentMaxBytes = 4096 // rotate often: each new segment needs the directory
	gw := startGateway(t, cfg)
	c, sctx := gw.session(t, "req")
	orders := c.Database("shop").Collection("orders")
	if _, err := orders.InsertOne(sctx, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}, {Key: "leaseMS", Value: 600000}}).Err(); err != nil {
		t.Fatal(err)
	}
	inc := func() error {
		_, err := orders.UpdateOne(sctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
		return err
	}
	acked := 0
	for range 3 {
		if err := inc(); err != nil {
			t.Fatalf("update with a working trail: %v", err)
		}
		acked++
	}
	// The directory goes; a file takes its place.
	restore := breakTrailDir(t, dir)
	var refusal error
	for i := 0; i < 200 && refusal == nil; i++ {
		if err := inc(); err != nil {
			refusal = err
		} else {
			acked++ // still in the segment opened before
		}
	}
	var ce mongo.CommandError
	if !errors.As(refusal, &ce) || mongoerr.Code(ce.Code) != mongoerr.LockBusy || !strings.Contains(ce.Message, "audit trail cannot take it") {
		t.Fatalf("update with a failing trail: %v, want LockBusy audit_unavailable", refusal)
	}
	var doc struct{ N int }
	if err := orders.FindOne(sctx, bson.D{{Key: "_id", Value: 1}}).Decode(&doc); err != nil || doc.N != acked {
		t.Fatalf("n = %d (%v), want %d: a refused write was written", doc.N, err, acked)
	}
	// The directory comes back: writes pass again.
	restore()
	if err := inc(); err != nil {
		t.Fatalf("update once the trail works again: %v", err)
	}
	acked++
	if err := gw.stop(); err != nil {
		t.Fatal(err)
	}
	allowed, rep := allowedInTrail(t, dir, secret, "shop.orders", "update")
	if allowed != acked {
		t.Fatalf("%d allow records of updates, %d updates acknowledged", allowed, acked)
	}
	t.Logf("%d updates acknowledged before and after the failure, one refused; %s", acked, rep.Verdict())
}

// lockgate -check looks at the trail's key and directory.
func TestCheckAudit(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	os.WriteFile(key, []byte("short"), 0o600)
	c := config.Audit{Enabled: true, Dir: filepath.Join(dir, "trail"), KeyFile: key}
	if err := checkAudit(c); err == nil || !strings.Contains(err.Error(), "audit.keyFile") {
		t.Fatalf("short key: %v", err)
	}
	os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600)
	if err := checkAudit(c); err != nil {
		t.Fatalf("good key, new directory: %v", err)
	}
	c.Dir = key // a file
	if err := checkAudit(c); err == nil || !strings.Contains(err.Error(), "audit.dir") {
		t.Fatalf("a file as the directory: %v", err)
	}
}

// TestAuditTrailInACollection: a gateway whose only sink is a collection
// of the lock store's database. Clients cannot touch that collection
// through lockgate; a lock whose lease ran out and was taken over gives
// an expire record with the former holder's tag; GET /audit/history
// answers from the collection (?holder=); the trail verifies.
func TestAuditTrailInACollection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	secret := "0123456789abcdef0123456789abcdef-collection"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}
	cfg.Audit.Enabled, cfg.Audit.KeyFile, cfg.Audit.Instance = true, secretFile(t, secret), "gw-coll"
	cfg.Audit.Collection.Name = "audit"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, cfg)
	session := func(app string) (*mongo.Client, mongo.SessionContext) { return gw.session(t, app) }
	alpha, actx := session("alpha")
	beta, bctx := session("beta")
	// alpha's lease runs out; beta waits for the lock and takes it over.
	if err := alpha.Database("shop").RunCommand(actx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "leaseMS", Value: 300}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := beta.Database("shop").RunCommand(bctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}, {Key: "waitMS", Value: 20000}}).Err(); err != nil {
		t.Fatalf("beta's acquire after alpha's lease ran out: %v", err)
	}
	if _, err := beta.Database("shop").Collection("orders").InsertOne(bctx, bson.D{{Key: "_id", Value: 42}}); err != nil {
		t.Fatal(err)
	}
	// The trail's collection is sealed like the lock store's.
	for _, coll := range []string{"audit", "audit" + audittrail.HeadSuffix} {
		if _, err := alpha.Database("lockgate").Collection(coll).DeleteMany(actx, bson.D{}); err == nil {
			t.Fatalf("a client deleted lockgate.%s through lockgate", coll)
		}
	}

	var hist struct {
		Records []audittrail.Record `json:"records"`
	}
	admin := gw.admin + "/audit/history"
	var alphaTag string
	testkit.Eventually(t, 10*time.Second, "alpha's acquire on /audit/history", func() bool {
		_, body := httpGet(t, admin+"?app=alpha")
		json.Unmarshal([]byte(body), &hist)
		for _, r := range hist.Records {
			if r.Op == "acquire" {
				alphaTag = r.Holder
			}
		}
		return alphaTag != ""
	})
	var got []string
	testkit.Eventually(t, 10*time.Second, "two records of alpha's holder tag", func() bool {
		code, body := httpGet(t, admin+"?holder="+alphaTag)
		if err := json.Unmarshal([]byte(body), &hist); code != 200 || err != nil {
			t.Fatalf("/audit/history?holder=: %d %s", code, body)
		}
		got = got[:0]
		for _, r := range hist.Records {
			got = append(got, fmt.Sprintf("%s %s %s %s %v", r.Kind, r.Op, r.App, r.NS, r.IDs))
		}
		return len(got) >= 2
	})
	if alphaTag == "" || strings.Join(got, "; ") != "lock acquire alpha shop.orders [42]; lock expire alpha shop.orders [42]" {
		t.Fatalf("alpha's (%q) history: %q", alphaTag, got)
	}
	if exp := hist.Records[1]; len(exp.Tokens) != 1 || exp.Tokens[0] != hist.Records[0].Tokens[0] || !strings.Contains(exp.Detail, "without a release") {
		t.Fatalf("the expire record does not name alpha's lease: %+v (acquired %+v)", exp, hist.Records[0])
	}
	if err := gw.stop(); err != nil {
		t.Fatal(err)
	}
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	rep, err := audittrail.VerifyCollection(context.Background(), c.Database("lockgate").Collection("audit"), "gw-coll",
		audittrail.VerifyOptions{Keys: []audittrail.Key{audittrail.NewKey([]byte(secret))}})
	if err != nil || !rep.OK() || rep.Unsigned != 0 {
		t.Fatalf("the gateway's collection trail: %v %s %q", err, rep.Verdict(), rep.Notes)
	}
	t.Log(rep.Verdict())
}

// TestAuditRequiredSchemeRule: auditRequired on a rule with a locking
// scheme (holderFields). The scheme's steps that lockgate runs itself
// (the acquire, the release) and the holder's writes reach the database
// only once their allow record is durable: with the trail failing, an
// acquire is refused with LockBusy audit_unavailable and the document
// keeps no lock; with the trail back it works again; every acknowledged
// step has its allow record.
func TestAuditRequiredSchemeRule(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	dir := filepath.Join(t.TempDir(), "trail")
	secret := "0123456789abcdef0123456789abcdef-scheme"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "work.jobs", Mode: config.ModeEnforce, AuditRequired: true,
		Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000}}}
	cfg.Audit.Enabled, cfg.Audit.Dir, cfg.Audit.KeyFile = true, dir, secretFile(t, secret)
	cfg.Audit.SegmentMaxBytes = 4096 // rotate often: each new segment needs the directory
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, cfg)
	ctx := gw.ctx
	direct, err := mongo.Connect(ctx, options.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Disconnect(context.Background())
	if _, err := direct.Database("work").Collection("jobs").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}, {Key: "LockId", Value: nil}}); err != nil {
		t.Fatal(err)
	}
	c, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+gw.ProxyAddr().String()+"/").SetAppName("scheme-req"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	jobs := c.Database("work").Collection("jobs")
	free := bson.D{{Key: "_id", Value: 1}, {Key: "LockId", Value: nil}}
	mine := bson.D{{Key: "_id", Value: 1}, {Key: "LockId", Value: "me"}}
	acquire := func() error {
		return jobs.FindOneAndUpdate(ctx, free, bson.D{{Key: "$set", Value: bson.D{{Key: "LockId", Value: "me"}, {Key: "LockTime", Value: time.Now()}}}}).Err()
	}
	work := func() error {
		_, err := jobs.UpdateOne(ctx, mine, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
		return err
	}
	release := func() error {
		_, err := jobs.UpdateOne(ctx, mine, bson.D{{Key: "$set", Value: bson.D{{Key: "LockId", Value: nil}}}})
		return err
	}
	// acquires, works: acknowledged; held: the lock as acknowledged.
	acquires, works, held := 0, 0, false
	// cycle runs acquire, work, release, stopping at the first refusal.
	cycle := func() error {
		if err := acquire(); err != nil {
			return err
		}
		acquires, held = acquires+1, true
		if err := work(); err != nil {
			return err
		}
		works++
		if err := release(); err != nil {
			return err
		}
		held = false
		return nil
	}
	if err := cycle(); err != nil {
		t.Fatalf("with a working trail: %v", err)
	}
	// The directory goes; a file takes its place.
	restore := breakTrailDir(t, dir)
	var refusal error
	for i := 0; i < 200 && refusal == nil; i++ {
		refusal = cycle() // steps pass while the segment opened before has room
	}
	var ce mongo.CommandError
	if !errors.As(refusal, &ce) || mongoerr.Code(ce.Code) != mongoerr.LockBusy || !strings.Contains(ce.Message, "audit trail cannot take it") {
		t.Fatalf("a scheme step with a failing trail: %v, want LockBusy audit_unavailable", refusal)
	}
	// The refused step wrote nothing: the document is as acknowledged.
	var doc struct {
		N      int
		LockId any
	}
	if err := direct.Database("work").Collection("jobs").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&doc); err != nil ||
		doc.N != works || (doc.LockId != nil) != held {
		t.Fatalf("after the refusal the document is %+v (%v), want n %d and the lock held: %v", doc, err, works, held)
	}
	t.Logf("refused: %v", refusal)
	// The directory comes back: the scheme works again (a refused acquire
	// left no mirror behind).
	restore()
	if held {
		if err := release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cycle(); err != nil {
		t.Fatalf("once the trail works again: %v", err)
	}
	if err := gw.stop(); err != nil {
		t.Fatal(err)
	}
	allowed, rep := allowedInTrail(t, dir, secret, "work.jobs", "findAndModify")
	if allowed < acquires {
		t.Fatalf("%d allow records of acquires, %d acquires acknowledged", allowed, acquires)
	}
	t.Logf("%d acquires acknowledged; %s", acquires, rep.Verdict())
}

// lockgate -check writes a test document into the audit collection and
// its head collection and deletes it: credentials that may read the
// collection but not write it fail the check (they would fail the
// trail's first batch, and in required mode every write).
func TestCheckAuditCollectionWrites(t *testing.T) {
	start := func(mayWrite []string) string {
		up, err := scripted.StartPerConn(func() scripted.Handler {
			h, err := scripted.SCRAMAuthz(map[string]string{"auditor": "auditor-pw"},
				map[string][]string{"auditor": mayWrite}, map[string][]string{"auditor": {"lockgate.audit"}},
				func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
					if cmd == nil {
						return nil
					}
					b := bsoncore.NewDocumentBuilder()
					switch cmd.Name {
					case "find":
						b.AppendDocument("cursor", bsoncore.NewDocumentBuilder().AppendInt64("id", 0).
							AppendString("ns", cmd.DB+"."+cmd.Collection).AppendArray("firstBatch", bsoncore.NewArrayBuilder().Build()).Build())
					case "insert", "delete":
						b.AppendInt32("n", 1)
					default:
						b.AppendBoolean("isWritablePrimary", true).AppendInt32("maxWireVersion", 21).
							AppendInt32("maxBsonObjectSize", 16<<20).AppendInt32("maxMessageSizeBytes", 48000000).AppendInt32("maxWriteBatchSize", 100000)
					}
					return s.Reply(req, b.AppendDouble("ok", 1).Build())
				})
			if err != nil {
				panic(err)
			}
			return h
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { up.Close() })
		return "mongodb://auditor:auditor-pw@" + up.Addr() + "/?directConnection=true&authMechanism=SCRAM-SHA-256"
	}
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	result := func(uri string) CheckResult {
		cfg := testConfig()
		cfg.Upstream.URI = uri // the other checks answered quickly, not what this test looks at
		cfg.Audit.Enabled, cfg.Audit.KeyFile = true, keyFile
		cfg.Audit.Collection = config.AuditCollection{Name: "audit", Database: "lockgate", URI: uri}
		for _, r := range Check(context.Background(), cfg) {
			if r.Name == "audit.collection" {
				return r
			}
		}
		t.Fatal("no audit.collection check")
		return CheckResult{}
	}
	if r := result(start(nil)); r.Err == nil || !strings.Contains(r.Err.Error(), "test insert into lockgate.audit") {
		t.Fatalf("read-only credentials: %+v, want the test insert refused", r)
	}
	if r := result(start([]string{"lockgate.audit", "lockgate.audit_head"})); r.Err != nil {
		t.Fatalf("credentials that may write: %v", r.Err)
	}
}

// breakTrailDir puts a file where the trail's directory was, so that
// every new segment fails; restore puts the directory back.
func breakTrailDir(t *testing.T, dir string) (restore func()) {
	t.Helper()
	moved := dir + ".moved"
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(moved, dir); err != nil {
			t.Fatal(err)
		}
	}
}

// allowedInTrail verifies the trail in dir and counts its allow records
// of op on document 1 of ns.
func allowedInTrail(t *testing.T, dir, secret, ns, op string) (int, *audittrail.Report) {
	t.Helper()
	rep, err := audittrail.Verify(dir, []audittrail.Key{audittrail.NewKey([]byte(secret))})
	if err != nil || !rep.OK() {
		t.Fatalf("trail: %v %s", err, rep.Verdict())
	}
	allowed := 0
	err = audittrail.Query(dir, audittrail.Filter{NS: ns, ID: "1"}, func(r *audittrail.Record) error {
		if r.Kind == audittrail.KindDecision && r.Op == op && r.Verdict == audittrail.VerdictAllow {
			allowed++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return allowed, rep
}
