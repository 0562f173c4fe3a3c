//go:build !linux

package audittrail

// threadCPU is not measured off Linux.
func threadCPU() int64 { return 0 }
