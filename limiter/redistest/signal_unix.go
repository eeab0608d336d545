//go:build unix

package redistest

import (
	"errors"
	"syscall"
)

// Pause freezes the server (SIGSTOP): it keeps its connections and accepts new ones
// but answers nothing, as a hung or overloaded server would, until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("redistest: server not running")
	}
	return s.proc.Cmd.Process.Signal(sig)
}
