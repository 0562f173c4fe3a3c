package gateway

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

func startEmbedded(t *testing.T) *embedded.Server {
	t.Helper()
	up, err := embedded.Start(embedded.Options{
		Addr:   "127.0.0.1:0",
		Dir:    t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

func testConfig() *config.Config {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.ShutdownTimeout = config.Duration(3 * time.Second)
	return cfg
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestGatewayAgainstEmbeddedUpstream assembles a whole lockgate in front
// of the real embedded upstream and checks every admin endpoint and one
// round trip through the proxy.
func TestGatewayAgainstEmbeddedUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + gw.AdminAddr().String()

	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}

	// The upstream monitor needs a moment to find the server.
	var rd admin.Readiness
	testkit.Eventually(t, 15*time.Second, "/readyz to answer 200", func() bool {
		code, body := httpGet(t, base+"/readyz")
		rd = admin.Readiness{}
		if err := json.Unmarshal([]byte(body), &rd); err != nil {
			t.Fatalf("/readyz body %q: %v", body, err)
		}
		return code == 200
	})
	names := []string{}
	for _, c := range rd.Checks {
		names = append(names, c.Name)
	}
	if rd.Status != "ready" || strings.Join(names, ",") != "serving,upstream,lockstore,policy,connections" {
		t.Errorf("/readyz = %+v", rd)
	}

	// One real round trip through the proxy.
	mctx, mcancel := context.WithTimeout(ctx, 15*time.Second)
	defer mcancel()
	client, err := mongo.Connect(mctx, options.Client().
		ApplyURI("mongodb://"+gw.ProxyAddr().String()+"/").
		SetServerSelectionTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	coll := client.Database("gatewaytest").Collection("things")
	if _, err := coll.InsertOne(mctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: "x"}}); err != nil {
		t.Fatalf("insert through the proxy: %v", err)
	}
	var doc bson.M
	if err := coll.FindOne(mctx, bson.D{{Key: "_id", Value: 1}}).Decode(&doc); err != nil || doc["v"] != "x" {
		t.Fatalf("find through the proxy: %v %v", doc, err)
	}
	client.Disconnect(mctx)

	code, body := httpGet(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{"lockgate_client_connections_total", "go_goroutines", "go_build_info", "process_cpu_seconds_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	cancel()
	waitDone(t, gw)
	if err := gw.Wait(); err != nil {
		t.Errorf("Wait after cancel = %v", err)
	}
	if _, err := net.DialTimeout("tcp", gw.ProxyAddr().String(), time.Second); err == nil {
		t.Error("proxy listener still open after Wait")
	}
}

func waitDone(t *testing.T, gw *Gateway) {
	t.Helper()
	select {
	case <-gw.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("gateway did not stop within 15s of cancel")
	}
}

// The gateway starts without a reachable upstream, reports not ready with
// the reason, and stops cleanly.
func TestGatewayUnreachableUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()

	cfg := testConfig()
	cfg.Upstream.URI = "mongodb://" + deadAddr + "/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
	cfg.Upstream.DialTimeout = config.Duration(300 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	code, body := httpGet(t, "http://"+gw.AdminAddr().String()+"/readyz")
	var rd admin.Readiness
	json.Unmarshal([]byte(body), &rd)
	if code != 503 || len(rd.Checks) != 5 || rd.Checks[0].Name != "serving" || !rd.Checks[0].OK ||
		rd.Checks[1].Name != "upstream" || rd.Checks[1].OK || rd.Checks[1].Error == "" ||
		rd.Checks[2].Name != "lockstore" || rd.Checks[2].OK {
		t.Errorf("/readyz = %d %s", code, body)
	}
	if code, _ := httpGet(t, "http://"+gw.AdminAddr().String()+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d while the upstream is down; liveness must not depend on it", code)
	}
	if gw.Registry() == nil {
		t.Error("nil registry")
	}
	cancel()
	waitDone(t, gw)
	if err := gw.Wait(); err != nil {
		t.Errorf("Wait = %v", err)
	}
}

func TestStartRefusesInvalidConfig(t *testing.T) {
	cfg := testConfig()
	cfg.Policy.Default = "strict"
	_, err := Start(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), `policy.default: must be one of off, audit, enforce, got "strict"`) {
		t.Fatalf("Start = %v", err)
	}
	if _, err := Start(context.Background(), nil, nil); err == nil {
		t.Fatal("Start(nil config) succeeded")
	}
}

// A failure after the first listener is bound must release it.
func TestStartCleansUpOnListenFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	cfg := testConfig()
	cfg.Listen = freeAddr
	cfg.Admin = busy.Addr().String()
	if _, err := Start(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "gateway: admin:") {
		t.Fatalf("Start with a busy admin port = %v", err)
	}
	ln, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Fatalf("the client listener was not released: %v", err)
	}
	ln.Close()
}

func TestSplitShutdown(t *testing.T) {
	for _, total := range []time.Duration{time.Second, 15 * time.Second, 10 * time.Minute} {
		p, a := splitShutdown(total)
		if p+a != total || a <= 0 || p < a || a > 2*time.Second {
			t.Errorf("splitShutdown(%v) = %v, %v", total, p, a)
		}
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := NewLoggerTo(config.Log{Level: config.LogLevelWarn, Format: config.LogFormatJSON}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", zap.String("k", "v"))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %q", buf.String())
	}
	if line["msg"] != "shown" || line["k"] != "v" || line["level"] != "warn" {
		t.Errorf("got %v", line)
	}

	buf.Reset()
	l, err = NewLoggerTo(config.Log{Level: config.LogLevelDebug, Format: config.LogFormatConsole}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("dbg")
	if s := buf.String(); !strings.Contains(s, "DEBUG") || !strings.Contains(s, "dbg") || strings.HasPrefix(s, "{") {
		t.Errorf("console line %q", s)
	}

	// No sampling: a burst of identical audit lines must all be written.
	buf.Reset()
	l, _ = NewLoggerTo(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON}, &buf)
	for range 500 {
		l.Info("decision")
	}
	if n := strings.Count(buf.String(), "\n"); n != 500 {
		t.Errorf("wrote %d of 500 identical lines", n)
	}

	for _, bad := range []config.Log{{Level: "fatal", Format: "json"}, {Level: "info", Format: "text"}} {
		if _, err := NewLoggerTo(bad, io.Discard); err == nil {
			t.Errorf("NewLoggerTo(%+v) succeeded", bad)
		}
	}
}

func TestServerTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, ca := writeCert(t, dir)

	if c, err := ServerTLS(config.TLS{ClientAuth: config.ClientAuthNone}); c != nil || err != nil {
		t.Errorf("TLS off = %v, %v", c, err)
	}
	tests := []struct {
		name string
		in   config.TLS
		want tls.ClientAuthType
		err  string
	}{
		{"server only", config.TLS{CertFile: cert, KeyFile: key, ClientAuth: config.ClientAuthNone}, tls.NoClientCert, ""},
		{"request without CA", config.TLS{CertFile: cert, KeyFile: key, ClientAuth: config.ClientAuthRequest}, tls.RequestClientCert, ""},
		{"request with CA", config.TLS{CertFile: cert, KeyFile: key, CAFile: ca, ClientAuth: config.ClientAuthRequest}, tls.VerifyClientCertIfGiven, ""},
		{"mutual", config.TLS{CertFile: cert, KeyFile: key, CAFile: ca, ClientAuth: config.ClientAuthRequireAndVerify}, tls.RequireAndVerifyClientCert, ""},
		{"missing cert", config.TLS{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: key}, 0, "tls.certFile/tls.keyFile:"},
		{"key is not a key", config.TLS{CertFile: cert, KeyFile: cert}, 0, "tls.certFile/tls.keyFile:"},
		{"missing CA", config.TLS{CertFile: cert, KeyFile: key, CAFile: filepath.Join(dir, "nope.pem"), ClientAuth: config.ClientAuthRequest}, 0, "tls.caFile:"},
		{"CA without PEM", config.TLS{CertFile: cert, KeyFile: key, CAFile: key + ".txt", ClientAuth: config.ClientAuthRequest}, 0, "tls.caFile: no PEM certificate"},
	}
	os.WriteFile(key+".txt", []byte("not pem"), 0o600)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ServerTLS(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ClientAuth != tt.want || len(c.Certificates) != 1 || c.MinVersion != tls.VersionTLS12 {
				t.Errorf("got ClientAuth %v, %d certs, min %x", c.ClientAuth, len(c.Certificates), c.MinVersion)
			}
			if (tt.in.CAFile != "") != (c.ClientCAs != nil) {
				t.Errorf("ClientCAs = %v", c.ClientCAs)
			}
		})
	}
}

// writeCert writes a self-signed certificate that also serves as its own CA.
func writeCert(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lockgate-test"},
		DNSNames:              []string{"localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for p, b := range map[string][]byte{
		certFile: certPEM,
		caFile:   certPEM,
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}

// The client listener really speaks TLS with the configured certificate
// and refuses clients without one under require-and-verify.
func TestGatewayClientTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	cert, key, ca := writeCert(t, t.TempDir())
	cfg := testConfig()
	cfg.Upstream.URI = startEmbedded(t).URI()
	cfg.TLS = config.TLS{CertFile: cert, KeyFile: key, CAFile: ca, ClientAuth: config.ClientAuthRequireAndVerify}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(ca)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	clientCert, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}

	c, err := tls.DialWithDialer(dialer, "tcp", gw.ProxyAddr().String(), &tls.Config{
		RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{clientCert},
	})
	if err != nil {
		t.Fatalf("mutual TLS handshake: %v", err)
	}
	c.Close()

	c, err = tls.DialWithDialer(dialer, "tcp", gw.ProxyAddr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost"})
	if err == nil {
		// TLS 1.3 reports the server's refusal on the first read.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("a client without a certificate was not refused: %v", err)
	}
	cancel()
	waitDone(t, gw)
}

// TestReadyzReportsTheConnectionLimit: while limits.maxConnections client
// connections are open, /readyz says not ready and names the check, so a
// load balancer sends new clients elsewhere; a freed slot makes it ready
// again (issue 12, deliverable 1).
func TestReadyzReportsTheConnectionLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Limits.MaxConnections = 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); waitDone(t, gw) }()
	readyz := func() (int, admin.Readiness) {
		code, body := httpGet(t, "http://"+gw.AdminAddr().String()+"/readyz")
		var rd admin.Readiness
		if err := json.Unmarshal([]byte(body), &rd); err != nil {
			t.Fatalf("/readyz body %q: %v", body, err)
		}
		return code, rd
	}
	waitFor := func(want int) admin.Readiness {
		t.Helper()
		var rd admin.Readiness
		testkit.Eventually(t, 15*time.Second, fmt.Sprintf("/readyz %d", want), func() bool {
			var code int
			code, rd = readyz()
			return code == want
		})
		return rd
	}
	waitFor(200)
	conns := make([]net.Conn, 2)
	for i := range conns {
		c, err := net.DialTimeout("tcp", gw.ProxyAddr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	rd := waitFor(503)
	for _, c := range rd.Checks {
		if c.Name == "connections" && (c.OK || !strings.Contains(c.Error, "maxConnections")) {
			t.Errorf("connections check = %+v, want it failing and naming limits.maxConnections", c)
		} else if c.Name != "connections" && !c.OK {
			t.Errorf("check %s failed too: %+v", c.Name, c)
		}
	}
	conns[0].Close()
	waitFor(200)
}
