// Package progress is the one status line that the sluice commands and the load
// tool show while they work: rewritten in place on a terminal, and elsewhere (logs,
// pipes, tests) either a plain line per update or nothing, as the caller chooses.
package progress

import (
	"fmt"
	"io"
	"os"
)

// Line writes a status line to w.
type Line struct {
	w        io.Writer
	terminal bool
	shown    bool // a line was written on the terminal and not yet cleared or ended
}

// New returns a status line on w.
func New(w io.Writer) *Line { return &Line{w: w, terminal: IsTerminal(w)} }

// Terminal reports whether the line is rewritten in place.
func (l *Line) Terminal() bool { return l.terminal }

// Show replaces the line on a terminal; elsewhere it writes s as a line of its own.
func (l *Line) Show(s string) {
	if l.terminal {
		fmt.Fprint(l.w, "\r\033[K"+s)
		l.shown = true
		return
	}
	fmt.Fprintln(l.w, s)
}

// Clear erases the line from a terminal, if one is shown.
func (l *Line) Clear() {
	if l.shown {
		fmt.Fprint(l.w, "\r\033[K")
		l.shown = false
	}
}

// End keeps the line on a terminal and moves past it, if one is shown.
func (l *Line) End() {
	if l.shown {
		fmt.Fprintln(l.w)
		l.shown = false
	}
}

// IsTerminal reports whether w is a character device other than /dev/null.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && f.Name() != os.DevNull
}
