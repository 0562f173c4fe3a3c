// Command lockgate-devstack is the dev stack itself (package devstack). It
// is built and started by cmd/devstack, which is what users run; running it
// directly works too.
package main

import (
	"os"

	"github.com/lockgate/lockgate/internal/devstack"
)

func main() {
	os.Exit(devstack.Main(os.Args[1:], os.Stdout, os.Stderr))
}
