package childproc

import "syscall"

// Attr makes the kernel kill a child (SIGKILL) when the process that started it
// dies, so that no server outlives a crashed test binary or load run.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
