package main

import (
	"context"
	"fmt"
	"io"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
)

// runCheck is -check: for init containers and CI. The configuration was
// validated by loadConfig already; this checks what only the running
// environment can tell (files, the upstream, the lock store) and prints
// one line per check.
func runCheck(ctx context.Context, cfg *config.Config, stdout io.Writer) int {
	fmt.Fprintln(stdout, "ok      configuration")
	code := exitOK
	for _, r := range gateway.Check(ctx, cfg) {
		if r.Err != nil {
			code = exitFailure
			fmt.Fprintf(stdout, "FAILED  %s: %s: %v\n", r.Name, r.Detail, r.Err)
			continue
		}
		fmt.Fprintf(stdout, "ok      %s: %s\n", r.Name, r.Detail)
	}
	return code
}
