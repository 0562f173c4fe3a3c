package reliability

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
)

// testPKI is a CA and a server certificate for 127.0.0.1 and localhost,
// written as PEM files.
type testPKI struct {
	CAFile, CertFile, KeyFile string
	Pool                      *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lockgate reliability test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := testPKI{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "server.pem"),
		KeyFile:  filepath.Join(dir, "server.key"),
		Pool:     x509.NewCertPool(),
	}
	p.Pool.AddCert(caCert)
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{p.CAFile, "CERTIFICATE", caDER}, {p.CertFile, "CERTIFICATE", der}, {p.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// startTLSFerretDB runs FerretDB with only a TLS listener (testserver/embedded
// has no TLS option) and returns its address.
func startTLSFerretDB(t *testing.T, pki testPKI) string {
	t.Helper()
	dir, err := os.MkdirTemp(tmpfsDir(), "lockgate-tls-")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{
			TLS:         "127.0.0.1:0",
			TLSCertFile: pki.CertFile,
			TLSKeyFile:  pki.KeyFile,
		},
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("FerretDB (TLS) did not stop within 10s")
		}
		os.RemoveAll(dir)
	})
	var addr string
	testkit.Eventually(t, 30*time.Second, "FerretDB's TLS listener", func() bool {
		u, err := url.Parse(f.MongoDBURI())
		if err != nil || strings.HasSuffix(u.Host, ":0") {
			return false
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", u.Host, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
		if err != nil {
			return false
		}
		c.Close()
		addr = u.Host
		return true
	})
	return addr
}

// TestTLSBothWays is item 6 of issue 5: FerretDB listens with TLS only;
// lockgate reaches it with tls=true&tlsCAFile in upstream.uri (its client
// connections, lock store and resolver all use that URI) and serves its
// own clients with tls.certFile/keyFile. The Go driver connects to lockgate
// with TLS and does CRUD, a locked write and a refused unlocked write. A
// plain-TCP client is refused by lockgate, and a plain-TCP connection to
// FerretDB's TLS port gets no answer, so both legs really are TLS.
//
// Parallel: its FerretDB, gateway and collection are its own, it counts no
// goroutines and waits for no lease; most of its time is two servers
// starting.
func TestTLSBothWays(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	upAddr := startTLSFerretDB(t, pki)
	q := url.Values{"tls": {"true"}, "tlsCAFile": {pki.CAFile}}
	upURI := "mongodb://" + upAddr + "/?" + q.Encode()

	collName := uniq("tls")
	ns := relDB + "." + collName
	cfg := gatewayConfig(upURI, uniq("locks"), ns)
	cfg.TLS = config.TLS{CertFile: pki.CertFile, KeyFile: pki.KeyFile, ClientAuth: config.ClientAuthNone}
	g := startGateway(t, cfg)
	ctx := testCtx(t, time.Minute)

	// The upstream leg is TLS: FerretDB's port does not speak plain TCP.
	plainUp, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+upAddr+"/?directConnection=true").SetServerSelectionTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := plainUp.Ping(ctx, nil); err == nil {
		t.Fatalf("a plain-TCP ping to FerretDB's TLS port succeeded: the upstream leg would not prove TLS")
	}
	plainUp.Disconnect(ctx)

	// The client leg is TLS: lockgate refuses plain TCP.
	plain, err := mongo.Connect(ctx, options.Client().ApplyURI(g.URI).SetServerSelectionTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Ping(ctx, nil); err == nil {
		t.Fatalf("a plain-TCP ping to lockgate's TLS listener succeeded")
	}
	plain.Disconnect(ctx)

	clientURI := "mongodb://" + g.Addr + "/?" + q.Encode()
	c := connect(t, clientURI, "tls-client")
	db := c.Database(relDB)
	free := db.Collection(collName + "_free")
	if _, err := free.InsertOne(ctx, bson.D{{"_id", 1}, {"v", "a"}}); err != nil {
		t.Fatalf("insert over TLS both ways: %v", err)
	}
	if _, err := free.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"v", "b"}}}}); err != nil {
		t.Fatalf("update over TLS: %v", err)
	}
	var doc bson.M
	if err := free.FindOne(ctx, bson.D{{"_id", 1}}).Decode(&doc); err != nil || doc["v"] != "b" {
		t.Fatalf("find over TLS: %v %v", doc, err)
	}
	if res, err := free.DeleteOne(ctx, bson.D{{"_id", 1}}); err != nil || res.DeletedCount != 1 {
		t.Fatalf("delete over TLS: %v %v", res, err)
	}

	// Enforcement over TLS: the lock store is reached through the TLS URI.
	prot := db.Collection(collName)
	if _, err := prot.InsertOne(ctx, counterDoc{ID: 7}); err != nil {
		t.Fatal(err)
	}
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.EndSession(context.Background())
	sctx := mongo.NewSessionContext(ctx, s)
	_, err = prot.UpdateOne(sctx, bson.D{{"_id", 7}}, bson.D{{"$inc", bson.D{{"n", 1}}}})
	if commandCode(err) != 46 {
		t.Fatalf("unlocked write over TLS: got %v, want LockBusy (46)", err)
	}
	if err := db.RunCommand(sctx, bson.D{{"acquireLock", collName}, {"ids", bson.A{7}}}).Err(); err != nil {
		t.Fatalf("acquireLock over TLS: %v", err)
	}
	if res, err := prot.UpdateOne(sctx, bson.D{{"_id", 7}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil || res.ModifiedCount != 1 {
		t.Fatalf("locked write over TLS: %v %v", res, err)
	}
	var rel bson.M
	if err := db.RunCommand(sctx, bson.D{{"releaseLock", collName}, {"ids", bson.A{7}}}).Decode(&rel); err != nil || rel["released"] != int32(1) {
		t.Fatalf("releaseLock over TLS: %v %v", rel, err)
	}
	var d counterDoc
	if err := prot.FindOne(ctx, bson.D{{"_id", 7}}).Decode(&d); err != nil || d.N != 1 {
		t.Fatalf("counter after one locked write and one refused: %+v %v", d, err)
	}
	t.Logf("TLS client -> lockgate (%s) -> TLS FerretDB (%s): CRUD, locked write, refused unlocked write", g.Addr, upAddr)
}
