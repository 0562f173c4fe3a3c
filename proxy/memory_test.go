package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
)

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// serveDirect runs a Server on a fresh listener and returns it with its
// address; the test reaches into it to see the connections' state.
func serveDirect(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	opts.Logger = zap.NewNop()
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = time.Second
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return srv, ln.Addr().String()
}

// sinkUpstream answers every request it can frame with {ok: 1} padded to
// about half a KiB, and keeps nothing, so that the test process's heap is
// the proxy's. The padding makes a client that never reads fill its
// socket after some thousands of replies rather than hundreds of
// thousands, which under the race detector on a loaded machine took the
// proxy longer than the test's patience.
func sinkUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ok, _ := bson.Marshal(bson.D{{"ok", 1.0}, {"pad", string(make([]byte, 512))}})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					raw, err := wire.ReadMessage(r, nil, wire.Limits{})
					if err != nil {
						return
					}
					if _, err := c.Write(wire.AppendMsg(nil, 1, raw.Header.RequestID, 0, ok)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// replyAll answers every request itself, as the proxy does for lock
// commands.
type replyAll struct{ reply []byte }

func (r replyAll) Intercept(context.Context, *Request) Decision {
	return Decision{Action: Reply, Reply: r.reply}
}

// TestSlowReadersAreBoundedByBackpressure: a client that pipelines
// requests and never reads a reply (issue 12, deliverable 1) costs the
// proxy bounded memory, whether the upstream or the proxy itself answers:
// replies are written to the client synchronously, so the proxy stops
// reading that client's requests once its socket is full instead of
// queueing replies. The watchdog then closes it after WriteTimeout.
func TestSlowReadersAreBoundedByBackpressure(t *testing.T) {
	reply, _ := bson.Marshal(bson.D{{"ok", 1.0}, {"pad", string(make([]byte, 512))}})
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"upstream answers", Options{Upstream: dialTo(sinkUpstream(t))}},
		{"proxy answers", Options{Upstream: dialTo(sinkUpstream(t)), Interceptor: replyAll{reply}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const clients = 8
			// The last write may stop inside a message: that one is closed
			// by the message timeout instead.
			tc.opts.WriteTimeout, tc.opts.MessageTimeout = 1500*time.Millisecond, 1500*time.Millisecond
			srv, addr := serveDirect(t, tc.opts)
			before := heapInUse()
			req, _ := bson.Marshal(bson.D{{"ping", 1}, {"$db", "admin"}})
			// 64 KiB of pipelined pings per write.
			var batch []byte
			for i := int32(0); len(batch) < 64<<10; i++ {
				batch = wire.AppendMsg(batch, i, 0, 0, req)
			}
			conns := make([]net.Conn, clients)
			sent := make([]int, clients)
			for i := range conns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				conns[i] = c
				// Write until the proxy stops taking requests: the proof of
				// backpressure is that a write blocks.
				for {
					c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
					n, err := c.Write(batch)
					sent[i] += n
					if err != nil {
						if !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("client %d: %v", i, err)
						}
						break
					}
					if sent[i] > 256<<20 {
						t.Fatalf("client %d pipelined 256 MiB without the proxy pushing back", i)
					}
				}
			}
			grew := heapInUse() - before
			total := 0
			for _, n := range sent {
				total += n
			}
			t.Logf("%d clients pipelined %d KiB without reading; proxy heap grew %d KiB (%d KiB per client)",
				clients, total>>10, grew>>10, grew/clients>>10)
			if per := grew / clients; per > 1<<20 {
				t.Errorf("each slow reader costs %d KiB of heap, want at most 1 MiB", per>>10)
			}
			// The watchdog closes every one of them, unread replies and all.
			// Each proxy connection first works through what its client's
			// socket already holds, until its own writes to the client stall.
			testkit.Eventually(t, 30*time.Second, "the watchdog to close every slow reader", func() bool { return srv.open.Load() == 0 })
			for i, c := range conns {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.Copy(io.Discard, c); isTimeout(err) {
					t.Errorf("client %d is still open", i)
				}
			}
		})
	}
}

// TestTricklingWritersHoldWhatTheySent: a client that declares a large
// message and trickles it (issue 12, deliverable 1) holds about what it
// has sent, not what it declared: 64 clients declaring 1 MiB and 48 MB
// MB messages used to pin 64-128 MiB between them.
func TestTricklingWritersHoldWhatTheySent(t *testing.T) {
	for _, declared := range []int{1 << 20, wire.DefaultMaxMessageSize} {
		t.Run(byteSize(declared), func(t *testing.T) {
			const clients = 64
			srv, addr := serveDirect(t, Options{Upstream: dialTo(sinkUpstream(t)), MessageTimeout: time.Minute})
			before := heapInUse()
			for i := 0; i < clients; i++ {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				h := wire.Header{MessageLength: int32(declared), RequestID: int32(i), OpCode: wire.OpCodeMsg}.Append(nil)
				h = binary.LittleEndian.AppendUint32(h, 0) // flags
				h = append(h, make([]byte, 1000)...)       // the first of many bytes
				if _, err := c.Write(h); err != nil {
					t.Fatal(err)
				}
			}
			// Every connection holds the buffer of the message it reads.
			testkit.Eventually(t, 10*time.Second, "every client's message buffered", func() bool {
				return srv.pool.InUse() >= clients
			})
			grew := heapInUse() - before
			t.Logf("%d clients each declared %s and sent 1 KiB: proxy heap grew %d KiB", clients, byteSize(declared), grew>>10)
			if per := grew / clients; per > 128<<10 {
				t.Errorf("each trickling client holds %d KiB, want at most 128 KiB", per>>10)
			}
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}
