package wire

import (
	"os"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
)

// The codec starts no goroutines; the zstd and zlib codecs it creates per
// call must not leave any behind either.
func TestMain(m *testing.M) {
	os.Exit(testkit.RunMain(m, nil))
}
