//go:build record

package capture

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/testserver/embedded"
	"github.com/lockgate/lockgate/wire"
)

// recorder relays every connection to the upstream and writes each frame,
// as read by wire.ReadMessage, to dir.
type recorder struct {
	t        *testing.T
	ln       net.Listener
	upstream string
	dir      string
	seq      atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startRecorder(t *testing.T, upstream, dir string) *recorder {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{t: t, ln: ln, upstream: upstream, dir: dir}
	r.wg.Add(1)
	go r.accept()
	return r
}

func (r *recorder) addr() string { return r.ln.Addr().String() }

func (r *recorder) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.upstream)
		if err != nil {
			r.t.Errorf("dial upstream: %v", err)
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, u)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pump(c, u, "c2s")
		go r.pump(u, c, "s2c")
	}
}

func (r *recorder) pump(from, to net.Conn, dir string) {
	defer r.wg.Done()
	defer to.Close()
	for {
		m, err := wire.ReadMessage(from, nil, wire.Limits{})
		if err != nil {
			if err != io.EOF && !strings.Contains(err.Error(), "use of closed") {
				r.t.Logf("%s: %v", dir, err)
			}
			return
		}
		n := r.seq.Add(1)
		name := fmt.Sprintf("%03d-%s-%s.bin", n, dir, strings.ToLower(m.Header.OpCode.String()))
		if err := os.WriteFile(filepath.Join(r.dir, name), m.Bytes, 0o644); err != nil {
			r.t.Errorf("write capture: %v", err)
		}
		if _, err := to.Write(m.Bytes); err != nil {
			return
		}
	}
}

func (r *recorder) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func TestRecord(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	root, err := filepath.Abs("../../wire/testdata/captures")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("go", func(t *testing.T) {
		rec := startRecorder(t, srv.Addr(), filepath.Join(root, "go"))
		defer rec.close()
		driveGo(t, "mongodb://"+rec.addr()+"/?directConnection=true&compressors=zstd,snappy,zlib&heartbeatFrequencyMS=60000")
	})
	t.Run("pymongo", func(t *testing.T) {
		if err := exec.Command("/usr/bin/python3", "-c", "import pymongo").Run(); err != nil {
			t.Fatal("pymongo is not installed (apt-get install python3-pymongo)")
		}
		rec := startRecorder(t, srv.Addr(), filepath.Join(root, "pymongo"))
		defer rec.close()
		runScript(t, "/usr/bin/python3", "drive_pymongo.py", "mongodb://"+rec.addr()+"/?directConnection=true&heartbeatFrequencyMS=60000")
	})
	t.Run("node", func(t *testing.T) {
		mods := os.Getenv("LOCKGATE_NODE_MODULES")
		if mods == "" {
			t.Fatal("set LOCKGATE_NODE_MODULES to a node_modules directory holding the mongodb package")
		}
		rec := startRecorder(t, srv.Addr(), filepath.Join(root, "node"))
		defer rec.close()
		t.Setenv("NODE_PATH", mods)
		runScript(t, "node", "drive_node.js", "mongodb://"+rec.addr()+"/?directConnection=true&heartbeatFrequencyMS=60000")
	})
}

func runScript(t *testing.T, interp, script, uri string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, interp, filepath.Join("testdata", script), uri).CombinedOutput()
	t.Logf("%s output:\n%s", script, out)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
}

func driveGo(t *testing.T, uri string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetMaxPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	coll := client.Database("capture").Collection("items")
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_ = coll.Drop(ctx)
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "name", Value: "one"}})
	must("insertOne", err)
	docs := make([]any, 0, 20)
	for i := 2; i <= 21; i++ {
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "n", Value: i}})
	}
	_, err = coll.InsertMany(ctx, docs)
	must("insertMany", err)
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(3))
	must("find", err)
	for i := 0; i < 7 && cur.Next(ctx); i++ { // two getMores, then killCursors on Close
	}
	must("cursor close", cur.Close(ctx))
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "name", Value: "uno"}}}})
	must("updateOne", err)
	_, err = coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: 2}})
	must("deleteOne", err)
	_, err = coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 3}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}),
		mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 4}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}),
		mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: 5}}),
		mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: 6}}),
	}, options.BulkWrite().SetOrdered(true))
	must("bulkWrite", err)
	res := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 7}}, bson.D{{Key: "$set", Value: bson.D{{Key: "locked", Value: true}}}})
	must("findOneAndUpdate", res.Err())
	sess, err := client.StartSession()
	must("startSession", err)
	err = mongo.WithSession(ctx, sess, func(sc mongo.SessionContext) error {
		_, err := coll.UpdateOne(sc, bson.D{{Key: "_id", Value: 8}}, bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: "s1"}}}})
		return err
	})
	must("session update", err)
	sess.EndSession(ctx)
}
