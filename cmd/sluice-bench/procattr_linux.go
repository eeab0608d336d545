package main

import "syscall"

// childAttr makes the kernel kill a server the cluster mode started if sluice-bench
// dies first, so that no nats-server or sluice outlives the run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
