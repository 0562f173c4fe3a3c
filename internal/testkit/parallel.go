package testkit

import (
	"flag"
	"strconv"
)

// DefaultParallel sets the testing package's -parallel to n unless the
// command line set it: for a package whose parallel tests mostly wait
// (leases running out, child processes, injected delays), so that more of
// them wait at once than go's default of one per CPU. TestMain calls it
// after flag.Parse and before m.Run.
func DefaultParallel(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			set = true
		}
	})
	if !set && flag.Lookup("test.parallel") != nil {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}
