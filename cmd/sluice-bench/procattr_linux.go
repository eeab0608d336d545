package main

import "syscall"

// childAttr makes the kernel kill a server the cluster mode started if sluice-bench
// dies first, so that no sluice outlives the run (natstest does the same for its
// nats-server processes).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
