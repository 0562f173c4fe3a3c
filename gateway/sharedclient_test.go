package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/wire"
)

// handshakeRelay relays TCP connections to target and records the
// application name of every connection's first message (a driver
// client's handshake): one name per driver client that talks to the
// deployment.
type handshakeRelay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	apps  map[string]bool
	conns []net.Conn
}

func startHandshakeRelay(t *testing.T, target string) *handshakeRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &handshakeRelay{ln: ln, target: target, apps: map[string]bool{}}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *handshakeRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Go(func() { r.relay(c) })
	}
}

func (r *handshakeRelay) relay(c net.Conn) {
	u, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, c, u)
	r.mu.Unlock()
	defer c.Close()
	defer u.Close()
	first, err := wire.ReadMessage(c, nil, wire.Limits{})
	if err != nil {
		return
	}
	// Recorded before the handshake goes on: a client's first operation
	// cannot complete before its connection's name is known here.
	if m, err := wire.Parse(first.Bytes, wire.Limits{}); err == nil {
		if cmd, err := wire.CommandOf(m); err == nil && cmd != nil && (cmd.Name == "hello" || strings.EqualFold(cmd.Name, "isMaster")) {
			app, _ := cmd.Body.Lookup("client", "application", "name").StringValueOK()
			r.mu.Lock()
			r.apps[app] = true
			r.mu.Unlock()
		}
	}
	if _, err := u.Write(first.Bytes); err != nil {
		return
	}
	go func() { io.Copy(c, u); c.Close() }()
	io.Copy(u, c)
}

func (r *handshakeRelay) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for a := range r.apps {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// TestGatewaySharesOneClientPerDeployment: the upstream monitor, the
// resolver and the lock store talk to the upstream deployment through one
// driver client (one monitor, one pool) when lockstore.uri is empty, and
// a lock store named by its own URI gets a client of its own. Every
// proxy-side client does work (readiness pings the upstream and the lock
// store, a write whose filter names no _id is resolved) before the names
// are read, so each one has shown its handshake by then.
func TestGatewaySharesOneClientPerDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	up := startEmbedded(t)
	for i, c := range []struct {
		name      string
		storeURI  func(relay string) string
		wantNames []string
	}{
		{"lock store on the upstream", func(string) string { return "" }, []string{"lockgate", "lockgate-test-client"}},
		{"lock store by its own URI", func(relay string) string { return "mongodb://" + relay + "/?connectTimeoutMS=9000" },
			[]string{"lockgate", "lockgate-lockstore", "lockgate-test-client"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			relay := startHandshakeRelay(t, up.Addr())
			cfg := testConfig()
			cfg.Upstream.URI = "mongodb://" + relay.ln.Addr().String() + "/"
			cfg.Lockstore.URI = c.storeURI(relay.ln.Addr().String())
			db := fmt.Sprintf("shared%d", i)
			cfg.Policy.Namespaces = []config.NamespaceRule{{Match: db + ".things", Mode: config.ModeEnforce}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer waitDone(t, gw)
			defer cancel()
			waitReady(t, "http://"+gw.AdminAddr().String())

			mctx, mcancel := context.WithTimeout(ctx, 30*time.Second)
			defer mcancel()
			client, err := mongo.Connect(mctx, options.Client().ApplyURI("mongodb://"+gw.ProxyAddr().String()+"/").SetAppName("lockgate-test-client"))
			if err != nil {
				t.Fatal(err)
			}
			defer client.Disconnect(context.Background())
			coll := client.Database(db).Collection("things")
			if _, err := coll.InsertOne(mctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: "x"}}); err != nil {
				t.Fatal(err)
			}
			err = client.UseSession(mctx, func(sc mongo.SessionContext) error {
				if err := client.Database(db).RunCommand(sc, bson.D{{Key: "acquireLock", Value: "things"}, {Key: "ids", Value: bson.A{1}}}).Err(); err != nil {
					return err
				}
				res, err := coll.UpdateOne(sc, bson.D{{Key: "v", Value: "x"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: "y"}}}})
				if err == nil && res.ModifiedCount != 1 {
					t.Errorf("resolved update modified %d", res.ModifiedCount)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := relay.names(); !slices.Equal(got, c.wantNames) {
				t.Fatalf("driver clients seen by the deployment: %q, want %q", got, c.wantNames)
			}
		})
	}
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
}
