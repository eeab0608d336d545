//go:build !linux

package embedded

func diskFree(string) (uint64, error) { return 0, ErrDiskFreeUnknown }
