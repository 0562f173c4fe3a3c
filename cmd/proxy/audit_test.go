package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/testserver/embedded"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	mongooptions "go.mongodb.org/mongo-driver/mongo/options"
)

func TestAuditSubcommands(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	secret := "c0ffee-c0ffee-c0ffee-c0ffee-c0ffee-00"
	os.WriteFile(keyFile, []byte(secret+"\n"), 0o600)
	tr, err := audittrail.Open(audittrail.Options{Dir: dir, Instance: "cli", Key: audittrail.NewKey([]byte(secret)), CheckpointEvery: 2})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := docid.Of(int32(42))
	other, _ := docid.Of(int32(7))
	for _, ev := range []audittrail.Event{
		{Kind: audittrail.KindLock, Op: "acquire", NS: "shop.orders", IDs: []docid.ID{id}, Verdict: "ok", App: "billing", Holder: "s1", Tokens: []int64{5}},
		{Kind: audittrail.KindDecision, Op: "update", NS: "shop.orders", IDs: []docid.ID{id}, Verdict: "allow", App: "billing", Holder: "s1", Tokens: []int64{5}},
		{Kind: audittrail.KindDecision, Op: "update", NS: "shop.orders", IDs: []docid.ID{other}, Verdict: "allow", App: "billing", Holder: "s1"},
		{Kind: audittrail.KindDecision, Op: "delete", NS: "shop.orders", IDs: []docid.ID{id}, Verdict: "reject", Reason: "held_by_other", App: "cron", Holder: "s2"},
	} {
		if err := tr.Commit(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runOnce(t, []string{"audit", "verify", "-key", keyFile, dir}, env(nil))
	if code != exitOK || !strings.HasPrefix(out, "OK ") || strings.Count(out, "\n") != 1 {
		t.Fatalf("verify of an untouched trail: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runOnce(t, []string{"audit", "query", "-ns", "shop.orders", "-id", "42", dir}, env(nil))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 4 || !strings.Contains(lines[1], "\tlock\t") || !strings.Contains(lines[1], "acquire") ||
		!strings.Contains(lines[2], "\tupdate\tallow\t") || !strings.Contains(lines[3], "\tdelete\treject\theld_by_other\tcron") {
		t.Fatalf("query: exit %d\n%s", code, out)
	}
	code, out, _ = runOnce(t, []string{"audit", "query", "-holder", "s2", dir}, env(nil))
	if code != exitOK || strings.Count(out, "\n") != 2 {
		t.Fatalf("query of holder s2: exit %d\n%s", code, out)
	}
	if code, out, _ := runOnce(t, []string{"audit", "verify", "-key", keyFile, "-head", filepath.Join(dir, "head.json"), dir}, env(nil)); code != exitOK {
		t.Fatalf("verify -head with the trail's own head: exit %d %s", code, out)
	}
	if code, out, _ := runOnce(t, []string{"audit", "verify", "-key", keyFile, "-head", filepath.Join(dir, "missing.json"), dir}, env(nil)); code != exitFailure {
		t.Fatalf("verify -head naming no file: exit %d %s", code, out)
	}
	if code, _, _ := runOnce(t, []string{"audit", "verify", dir}, env(nil)); code != exitUsage {
		t.Fatalf("verify without a key: exit %d, want %d", code, exitUsage)
	}

	// One byte changed: exit 1 and a one-line verdict naming the place.
	seg := filepath.Join(dir, "trail-00000000000000000001.jsonl")
	b, _ := os.ReadFile(seg)
	os.WriteFile(seg, bytes.Replace(b, []byte(`"cron"`), []byte(`"cram"`), 1), 0o600)
	code, out, _ = runOnce(t, []string{"audit", "verify", "-key", keyFile, dir}, env(nil))
	if code != exitFailure || !strings.HasPrefix(out, "FAIL trail-00000000000000000001.jsonl line ") || strings.Count(out, "\n") != 1 {
		t.Fatalf("verify of an altered trail: exit %d\n%s", code, out)
	}
	t.Log(out)
}

// TestAuditSubcommandsOnACollection: verify and query read a trail
// collection (-uri, -collection) with the same verdicts as a directory.
func TestAuditSubcommandsOnACollection(t *testing.T) {
	up, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	ctx := context.Background()
	client, err := mongo.Connect(ctx, mongooptions.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	coll := client.Database("lockgate").Collection("audit")
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	secret := "c0ffee-c0ffee-c0ffee-c0ffee-c0ffee-00"
	os.WriteFile(keyFile, []byte(secret+"\n"), 0o600)
	id, _ := docid.Of(int32(42))
	for _, inst := range []string{"gw-a", "gw-b"} {
		tr, err := audittrail.Open(audittrail.Options{Collection: coll, Instance: inst, Key: audittrail.NewKey([]byte(secret)), CheckpointEvery: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range []audittrail.Event{
			{Kind: audittrail.KindDecision, Op: "update", NS: "shop.orders", IDs: []docid.ID{id}, Verdict: "allow", App: "billing", Holder: "s1"},
			{Kind: audittrail.KindDecision, Op: "delete", NS: "shop.orders", IDs: []docid.ID{id}, Verdict: "reject", Reason: "held_by_other", App: "cron", Holder: "s2"},
		} {
			if err := tr.Commit(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	src := []string{"-uri", up.URI(), "-collection", "lockgate.audit"}
	code, out, errOut := runOnce(t, append([]string{"audit", "verify", "-key", keyFile}, src...), env(nil))
	if code != exitOK || strings.Count(out, "OK ") != 2 || !strings.Contains(out, "instance gw-b") {
		t.Fatalf("verify of an untouched collection: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runOnce(t, append([]string{"audit", "query", "-ns", "shop.orders", "-id", "42", "-instance", "gw-a"}, src...), env(nil))
	if code != exitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, "\tdelete\treject\theld_by_other\tcron") {
		t.Fatalf("query: exit %d\n%s", code, out)
	}
	code, out, _ = runOnce(t, append([]string{"audit", "query", "-holder", "s2"}, src...), env(nil))
	if code != exitOK || strings.Count(out, "\n") != 3 {
		t.Fatalf("query of holder s2 on both instances: exit %d\n%s", code, out)
	}
	if code, _, _ := runOnce(t, []string{"audit", "verify", "-key", keyFile, "-collection", "lockgate.audit"}, env(nil)); code != exitUsage {
		t.Fatalf("-collection without -uri: exit %d, want %d", code, exitUsage)
	}
	// One field changed in gw-b's trail: exit 1, gw-a still OK, the
	// verdict names the document.
	if _, err := coll.UpdateOne(ctx, bson.D{{"instance", "gw-b"}, {"app", "cron"}}, bson.D{{"$set", bson.D{{"app", "cram"}}}}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runOnce(t, append([]string{"audit", "verify", "-key", keyFile}, src...), env(nil))
	if code != exitFailure || !strings.Contains(out, "OK ") || !strings.Contains(out, "FAIL lockgate.audit document ObjectId(") || !strings.Contains(out, "altered") {
		t.Fatalf("verify of an altered collection: exit %d\n%s", code, out)
	}
	t.Log(out)
}

// TestAuditVerifyPubkey: a trail signed with an Ed25519 key verifies with
// the public key alone (-pubkey); the private key file is no public key.
func TestAuditVerifyPubkey(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	d := t.TempDir()
	priv, pub := filepath.Join(d, "k.pem"), filepath.Join(d, "k.pub")
	for _, args := range [][]string{{"genpkey", "-algorithm", "ed25519", "-out", priv}, {"pkey", "-in", priv, "-pubout", "-out", pub}} {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v %s", args, err, out)
		}
	}
	key, err := audittrail.KeyFromFile(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(d, "trail")
	tr, err := audittrail.Open(audittrail.Options{Dir: dir, Instance: "cli", Key: key, CheckpointEvery: 2})
	if err != nil {
		t.Fatal(err)
	}
	tr.Append(audittrail.Event{Kind: audittrail.KindDecision, Op: "update", NS: "shop.orders", Verdict: "allow"})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runOnce(t, []string{"audit", "verify", "-pubkey", pub, dir}, env(nil)); code != exitOK || !strings.Contains(out, "signatures checked") {
		t.Fatalf("verify -pubkey: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, _ := runOnce(t, []string{"audit", "verify", "-pubkey", priv, dir}, env(nil)); code != exitUsage {
		t.Fatalf("-pubkey with a private key: exit %d, want %d", code, exitUsage)
	}
}
