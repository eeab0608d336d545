package main

import "syscall"

// childProcAttr makes the kernel kill a child process if the test binary dies first.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
