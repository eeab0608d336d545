//go:build unix

package natstest

import (
	"fmt"
	"os"
	"syscall"
)

// Pause freezes node i (SIGSTOP), as a stuck host or a paused VM would: its
// connections and routes stay open and it answers nothing until Resume.
func (c *Cluster) Pause(i int) { c.signal(i, syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (c *Cluster) Resume(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig os.Signal) {
	nd := c.nodes[i]
	nd.mu.Lock()
	proc := nd.proc
	nd.mu.Unlock()
	if proc == nil {
		c.fatal(fmt.Errorf("natstest: %s is not running", nd.name))
		return
	}
	if err := proc.Cmd.Process.Signal(sig); err != nil {
		c.fatal(fmt.Errorf("natstest: %s: %v: %w", nd.name, sig, err))
	}
}
