package audittrail

import "syscall"

// threadCPU is the calling thread's user+system CPU time in nanoseconds
// (the benchmark locks itself to its thread): unlike the wall clock it
// does not count the time other processes hold the core.
func threadCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
