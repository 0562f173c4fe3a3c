// Command lockgate-devstack is the dev stack itself (package devstack). It
// is built and started by cmd/devstack, which is what users run; running it
// directly works too.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/lockgate/lockgate/internal/devstack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SIGHUP reloads the policy instead of killing the process, which
	// would leave its temporary data directory behind.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	os.Exit(devstack.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup))
}
