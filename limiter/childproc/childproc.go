// Package childproc starts the server processes that the test helpers
// (limiter/redistest, queue/natstest) and the load tool run: output appended to a
// log file, the child tied to this process's life where the system allows it, and
// a wait until the server is ready or has died.
//
// It lives under limiter because limiter is the lowest of the layers that use it:
// limiter/redistest and queue/natstest both import it downwards (queue builds on
// limiter, never the other way round). It needs only the standard library.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// ErrExited is returned by WaitReady when the process exits before it is ready.
var ErrExited = errors.New("exited at start")

// Process is a started child process.
type Process struct {
	// Cmd is the started command; its Process may be signalled.
	Cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts cmd with its standard output and error appended to logPath (created
// if missing) and, on Linux, killed by the kernel when this process dies (even if
// it is killed before its cleanups run). A goroutine reaps the child; Exited is
// closed once it has.
func Start(cmd *exec.Cmd, logPath string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = Attr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed when the process has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Kill kills the process (SIGKILL, as a crash would) and waits until it is gone.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.exited
}

// WaitReady calls ready every poll interval until it reports true. It fails with
// ErrExited if the process exits first, with ctx's error when ctx ends, and with a
// timeout error after timeout; the process is left running in every case.
func (p *Process) WaitReady(ctx context.Context, timeout, poll time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if ready() {
			return nil
		}
		select {
		case <-p.exited:
			return ErrExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v", timeout)
		}
	}
}

// Tail returns the last max bytes of the file at path (a log, for error
// messages); "" if it cannot be read.
func Tail(path string, max int) string {
	b, _ := os.ReadFile(path)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
