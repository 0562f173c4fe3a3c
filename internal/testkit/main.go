package testkit

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// RunMain runs the package's tests between setup and the teardown it
// returns, then fails the run if a goroutine outlives them or teardown
// fails; TestMain passes the result to os.Exit. setup may be nil. ignore names the goroutines
// allowed to survive, each with a reason at the call site; none of
// lockgate's own may be among them.
//
// The leak check runs only after a passing run: after a failure, goroutines
// left behind by the failed test would hide its own message.
func RunMain(m *testing.M, setup func() (teardown func() error, err error), ignore ...goleak.Option) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	teardown := func() error { return nil }
	if setup != nil {
		td, err := setup()
		if err != nil {
			fmt.Fprintln(os.Stderr, "test setup:", err)
			return 1
		}
		if td != nil {
			teardown = td
		}
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintln(os.Stderr, "test teardown:", err)
		if code == 0 {
			code = 1
		}
	}
	if code != 0 || fuzzing() {
		return code
	}
	if err := goleak.Find(ignore...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked by the tests:", err)
		return 1
	}
	return 0
}

// fuzzing reports whether this process is a fuzzing run, whose coordinator
// and workers keep goroutines of the testing package alive past m.Run.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}
