//go:build !linux

package redistest

import "syscall"

// procAttr: only Linux can tie a child's life to its parent's; elsewhere the
// cleanups registered by Start and StartCluster are the only guarantee.
func procAttr() *syscall.SysProcAttr { return nil }
