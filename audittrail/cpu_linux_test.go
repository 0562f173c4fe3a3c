package audittrail

import "syscall"

// threadCPU is the calling thread's user+system CPU time in nanoseconds
// (the benchmark locks itself to its thread): unlike the wall clock it
// does not count the time other processes hold the core.
func threadCPU() int64 { return rusage(syscall.RUSAGE_THREAD) }

// processCPU is the whole process's user+system CPU time in nanoseconds.
func processCPU() int64 { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
