package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress shows "n/total" on a terminal while a long command works through items.
// It stays silent when the output is not a terminal (logs, pipes, tests), where a
// line rewritten with carriage returns would only be noise.
type progress struct {
	w       io.Writer
	total   int
	unit    string // what the items are, plural: "requests"
	started time.Time
	last    time.Time
	shown   bool
}

// progressDelay is how long a command runs before progress appears: short runs stay quiet.
const progressDelay = 500 * time.Millisecond

func newProgress(w io.Writer, total int, unit string) *progress {
	if !isTerminal(w) {
		return &progress{}
	}
	now := time.Now()
	return &progress{w: w, total: total, unit: unit, started: now, last: now}
}

// update reports that done items are finished; cheap enough to call often.
func (p *progress) update(done int) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.started) < progressDelay || now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last, p.shown = now, true
	fmt.Fprintf(p.w, "\r%d/%d %s (%d%%)", done, p.total, p.unit, done*100/max(p.total, 1))
}

// done clears the progress line, if one was shown.
func (p *progress) done() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && f.Name() != os.DevNull
}
