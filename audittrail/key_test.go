package audittrail

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
)

// ed25519Files writes a new Ed25519 key pair as PEM files (as openssl
// writes them) and returns their paths.
func ed25519Files(t *testing.T) (private, public string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	d := t.TempDir()
	private, public = filepath.Join(d, "audit.pem"), filepath.Join(d, "audit.pub.pem")
	os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600)
	return private, public
}

func mustKey(t *testing.T, path string) Key {
	t.Helper()
	k, err := KeyFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestEd25519Checkpoints: a trail signed with an Ed25519 private key
// verifies with the public key alone; a checkpoint signed by another key
// does not, nor does the trail with another public key.
func TestEd25519Checkpoints(t *testing.T) {
	privFile, pubFile := ed25519Files(t)
	priv, pub := mustKey(t, privFile), mustKey(t, pubFile)
	if priv.ID != pub.ID || !strings.HasPrefix(pub.ID, "e-") || pub.CanSign() == nil {
		t.Fatalf("key ids: private %q, public %q; the public key can sign: %v", priv.ID, pub.ID, pub.CanSign() == nil)
	}
	dir := t.TempDir()
	o := testOptions(dir)
	o.Key = priv
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		tr.Append(decision(t, i))
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := verify(t, dir, pub); !rep.OK() || !rep.Signed || rep.LastCheckpoint == 0 {
		t.Fatalf("with the public key: %s", rep.Verdict())
	}
	_, otherPubFile := ed25519Files(t)
	if rep := verify(t, dir, mustKey(t, otherPubFile)); rep.OK() || !strings.Contains(rep.Verdict(), "not among the keys given") {
		t.Fatalf("with another public key: %s", rep.Verdict())
	}
	// A checkpoint re-signed by another private key under this key's id.
	otherPrivFile, _ := ed25519Files(t)
	forger := mustKey(t, otherPrivFile)
	p := seg(t, dir, 0)
	ls := readLines(t, p)
	for i, l := range ls {
		r := parse(t, l)
		if r.Kind != KindCheckpoint || i == 0 {
			continue
		}
		r.MAC = forger.sign(&r)
		r.Hash, _ = r.computeHash(nil)
		ls[i] = line(t, &r)
		writeLines(t, p, ls)
		rep := verify(t, dir, pub)
		if rep.OK() || rep.Problem.Seq != r.Seq || !strings.Contains(rep.Verdict(), "bad checkpoint signature") {
			t.Fatalf("a checkpoint signed by another key: %s, want seq %d", rep.Verdict(), r.Seq)
		}
		return
	}
	t.Fatal("no checkpoint to forge")
}

// TestKeyRotation: a trail signed first with an HMAC secret, then (after
// a restart with a new key file) with an Ed25519 key, then with another
// Ed25519 key, verifies with all three keys; without the oldest it fails
// at the first checkpoint that key signed.
func TestKeyRotation(t *testing.T) {
	dir := t.TempDir()
	privA, pubA := ed25519Files(t)
	privB, pubB := ed25519Files(t)
	for _, k := range []Key{testKey, mustKey(t, privA), mustKey(t, privB)} {
		o := testOptions(dir)
		o.Key = k
		tr, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 7 {
			tr.Append(decision(t, i))
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]bool{}
	forEachRecord(t, dir, func(r *Record) {
		if r.Kind == KindCheckpoint {
			ids[r.KeyID] = true
		}
	})
	if len(ids) != 3 {
		t.Fatalf("checkpoint key ids: %v, want three", ids)
	}
	if rep := verify(t, dir, testKey, mustKey(t, pubA), mustKey(t, pubB)); !rep.OK() {
		t.Fatalf("with every key: %s", rep.Verdict())
	}
	rep := verify(t, dir, mustKey(t, pubA), mustKey(t, pubB))
	if rep.OK() || rep.Problem.Seq != 2 || !strings.Contains(rep.Verdict(), testKey.ID) {
		t.Fatalf("without the first key: %s", rep.Verdict())
	}
	rep = verify(t, dir, testKey, mustKey(t, pubB))
	if rep.OK() || !strings.Contains(rep.Verdict(), mustKey(t, pubA).ID) {
		t.Fatalf("without the second key: %s", rep.Verdict())
	}
}

// TestKeyFromOpenSSL: the key files openssl writes are read as they are.
func TestKeyFromOpenSSL(t *testing.T) {
	testkit.RequireTool(t, "openssl", testkit.OnPath("openssl", "apt-get install -y openssl"))
	d := t.TempDir()
	priv, pub := filepath.Join(d, "k.pem"), filepath.Join(d, "k.pub")
	for _, args := range [][]string{{"genpkey", "-algorithm", "ed25519", "-out", priv}, {"pkey", "-in", priv, "-pubout", "-out", pub}} {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v %s", args, err, out)
		}
	}
	kp, kq := mustKey(t, priv), mustKey(t, pub)
	if kp.ID != kq.ID || kp.CanSign() != nil {
		t.Fatalf("openssl keys: %q %q", kp.ID, kq.ID)
	}
	r := Record{Seq: 2, Kind: KindCheckpoint, KeyID: kp.ID}
	r.MAC = kp.sign(&r)
	if !kq.check(&r) {
		t.Fatal("a signature by openssl's private key does not verify with its public key")
	}
	// An RSA key is refused, not taken for an HMAC secret.
	rsa := filepath.Join(d, "rsa.pem")
	if out, err := exec.Command("openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:1024", "-out", rsa).CombinedOutput(); err != nil {
		t.Fatalf("openssl: %v %s", err, out)
	}
	if _, err := KeyFromFile(rsa); err == nil || !strings.Contains(err.Error(), "not an Ed25519 key") {
		t.Fatalf("an RSA key: %v", err)
	}
}
