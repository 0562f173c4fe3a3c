//go:build wiredump

package wire

import (
	"fmt"
	"testing"
)

// TestDumpCaptures is a tool, not a test: it prints the summary line of
// every golden capture, in the form goldenSummaries takes, after the
// captures were re-recorded (tests/capture). Run it with
//
//	go test -tags wiredump -run TestDumpCaptures ./wire
func TestDumpCaptures(t *testing.T) {
	for _, c := range loadCaptures(t) {
		m, err := Parse(c.raw, Limits{})
		if err != nil {
			t.Errorf("%s/%s: %v", c.client, c.name, err)
			continue
		}
		fmt.Printf("%q: %q,\n", c.client+"/"+c.name, summary(m))
	}
}
