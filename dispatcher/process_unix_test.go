//go:build unix

package dispatcher

import "syscall"

// Stop freezes the process as a debugger, a paused VM or a stall of its host would
// (SIGSTOP): its connections stay open and nothing of it runs.
func (p *Process) Stop() error { return p.proc.Cmd.Process.Signal(syscall.SIGSTOP) }

// Continue resumes a stopped process (SIGCONT).
func (p *Process) Continue() error { return p.proc.Cmd.Process.Signal(syscall.SIGCONT) }
