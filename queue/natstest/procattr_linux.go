package natstest

import "syscall"

// procAttr has the kernel kill a server process when the test binary dies, even
// before its cleanups ran.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
