//go:build !linux

package audittrail

// threadCPU and processCPU are not measured off Linux.
func threadCPU() int64 { return 0 }

func processCPU() int64 { return 0 }
