package testkit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// limitEnv makes this binary's TestMain call OnlyRaceScaled, as
// lockstore's and guard's do, for TestOnlyRaceScaledLimitsTheRun's child
// runs.
const limitEnv = "LOCKGATE_TESTKIT_LIMIT"

func TestMain(m *testing.M) {
	if os.Getenv(limitEnv) == "1" {
		if err := OnlyRaceScaled(false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	os.Exit(RunMain(m, nil))
}

// recorder is a testing.TB that records how a helper ended the test
// instead of ending the real one.
type recorder struct {
	testing.TB
	ended string // "fatal", "skip" or "" (returned)
	msg   string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended, r.msg = "fatal", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.ended, r.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder on a goroutine of its own, as the testing
// package runs a test, so that Goexit ends only f.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestRequireToolSkipsLocallyAndFailsUnderCI(t *testing.T) {
	missing := errors.New("apt-get install -y it")
	t.Setenv("CI", "")
	if r := run(t, func(tb testing.TB) { RequireTool(tb, "tool", missing) }); r.ended != "skip" {
		t.Errorf("without CI: ended %q (%s), want a skip", r.ended, r.msg)
	}
	t.Setenv("CI", "1")
	if r := run(t, func(tb testing.TB) { RequireTool(tb, "tool", missing) }); r.ended != "fatal" {
		t.Errorf("under CI: ended %q (%s), want a failure", r.ended, r.msg)
	}
	if r := run(t, func(tb testing.TB) { RequireTool(tb, "tool", nil) }); r.ended != "" {
		t.Errorf("tool present, under CI: ended %q (%s), want the test to go on", r.ended, r.msg)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	if r := run(t, func(tb testing.TB) {
		Eventually(tb, time.Minute, "the third look", func() bool { n++; return n == 3 })
	}); r.ended != "" || n != 3 {
		t.Errorf("ended %q after %d looks, want it to return on the third", r.ended, n)
	}
	r := run(t, func(tb testing.TB) { Eventually(tb, 0, "never", func() bool { return false }) })
	if r.ended != "fatal" {
		t.Errorf("a condition that never holds: ended %q, want a failure", r.ended)
	}
}

func TestOnPath(t *testing.T) {
	if err := OnPath("go-no-such-program-here", "nothing to install"); err == nil {
		t.Error("a program that does not exist is on PATH")
	}
}

// TestRelayCutAndRestore: bytes pass; after Cut the relayed connection is
// closed and the address refuses; after Restore it relays again.
func TestRelayCutAndRestore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	r := StartRelay(t, ln.Addr().String())
	echo := func() (net.Conn, error) {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			return nil, err
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			return c, err
		}
		buf := make([]byte, 4)
		_, err = io.ReadFull(c, buf)
		if err == nil && string(buf) != "ping" {
			err = fmt.Errorf("echoed %q", buf)
		}
		return c, err
	}
	c, err := echo()
	if err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	r.Cut()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a relayed connection survived Cut")
	}
	c.Close()
	if c, err := echo(); err == nil {
		c.Close()
		t.Fatal("the relay answered after Cut")
	}
	r.Restore(t)
	c, err = echo()
	if err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	c.Close()
}

// Within reports whether the condition came to hold in time, without
// ending the test either way.
func TestWithin(t *testing.T) {
	n := 0
	if !Within(5*time.Second, func() bool { n++; return n == 3 }) {
		t.Errorf("Within gave up on a condition that held at the third look")
	}
	if Within(30*time.Millisecond, func() bool { return false }) {
		t.Errorf("Within reported a condition that never held")
	}
}

// DefaultParallel sets -parallel only when the command line did not.
func TestDefaultParallel(t *testing.T) {
	f := flag.Lookup("test.parallel")
	was := f.Value.String()
	t.Cleanup(func() { flag.Set("test.parallel", was) })
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	DefaultParallel(7)
	want := "7"
	if explicit {
		want = was
	}
	if got := f.Value.String(); got != want {
		t.Errorf("-parallel = %s after DefaultParallel(7), want %s (set on the command line: %v)", got, want, explicit)
	}
}
