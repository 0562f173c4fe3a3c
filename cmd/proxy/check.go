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
// one line per check, then one per warning. With strict, a warning fails
// the check too: a CI job that validates a policy before it ships wants a
// misspelt rule to stop it, a start-up init container may not (the
// collection may be created later).
func runCheck(ctx context.Context, cfg *config.Config, strict bool, stdout io.Writer) int {
	fmt.Fprintln(stdout, "ok      configuration")
	code := exitOK
	for _, r := range gateway.Check(ctx, cfg) {
		switch {
		case r.Err != nil:
			code = exitFailure
			fmt.Fprintf(stdout, "FAILED  %s: %s: %v\n", r.Name, r.Detail, r.Err)
		case len(r.Warnings) > 0 && strict:
			code = exitFailure
			fmt.Fprintf(stdout, "FAILED  %s: %s (-strict)\n", r.Name, r.Detail)
		default:
			fmt.Fprintf(stdout, "ok      %s: %s\n", r.Name, r.Detail)
		}
		for _, w := range r.Warnings {
			fmt.Fprintf(stdout, "warning %s: %s\n", r.Name, w)
		}
	}
	return code
}
