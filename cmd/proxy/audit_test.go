package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/docid"
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
