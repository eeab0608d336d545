package redistest

import "syscall"

// procAttr makes the kernel kill a server when the test binary dies, even if it
// panics or is killed before its cleanups run.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
