//go:build !unix

package redistest

import "errors"

var errNoSignals = errors.New("redistest: Pause and Resume need a Unix system")

// Pause is not supported on this system.
func (s *Server) Pause() error { return errNoSignals }

// Resume is not supported on this system.
func (s *Server) Resume() error { return errNoSignals }
