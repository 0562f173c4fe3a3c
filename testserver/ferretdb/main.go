// Command ferretdb runs the embedded upstream (testserver/embedded) in a
// process of its own. Test binaries built with the race detector start
// their upstreams in it when LOCKGATE_TEST_FERRETDB names its binary
// (embedded.Start, scripts/test.sh): in the test process, the detector
// would instrument FerretDB and SQLite too, which are not lockgate's code
// and cost most of the race step's CPU.
//
// It prints "uri <connection string>" on stdout once it accepts
// connections, and stops when its stdin closes, so that it ends with the
// test process even when that is killed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/lockgate/lockgate/testserver/embedded"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "TCP address to listen on")
	dir := flag.String("dir", "", "directory of the SQLite files (required)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ferretdb: -dir is required")
		os.Exit(2)
	}
	srv, err := embedded.StartInProcess(embedded.Options{Addr: *addr, Dir: *dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
	fmt.Printf("uri %s\n", srv.URI())
	// Whatever stdin holds or however it ends, the parent is done with us.
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}
