package wire

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// The codec starts no goroutines; the zstd and zlib codecs it creates per
// call must not leave any behind either. Under -fuzz the process belongs to
// the fuzzing engine (coordinator and workers), whose goroutines are not
// the codec's, so the check runs for ordinary test runs only.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
