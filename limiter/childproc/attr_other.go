//go:build !linux

package childproc

import "syscall"

// Attr: only Linux can tie a child's life to its parent's; elsewhere the callers'
// cleanups are the only guarantee.
func Attr() *syscall.SysProcAttr { return nil }
