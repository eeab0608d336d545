package main

import (
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/cmd/internal/progress"
)

// itemProgress shows "n/total" on a terminal while a long command works through
// items. It stays silent when the output is not a terminal (logs, pipes, tests),
// where a line per update would only be noise.
type itemProgress struct {
	line    *progress.Line // nil: silent
	total   int
	unit    string // what the items are, plural: "requests"
	started time.Time
	last    time.Time
}

// progressDelay is how long a command runs before progress appears: short runs stay quiet.
const progressDelay = 500 * time.Millisecond

func newProgress(w io.Writer, total int, unit string) *itemProgress {
	line := progress.New(w)
	if !line.Terminal() {
		return &itemProgress{}
	}
	now := time.Now()
	return &itemProgress{line: line, total: total, unit: unit, started: now, last: now}
}

// update reports that done items are finished; cheap enough to call often.
func (p *itemProgress) update(done int) {
	if p.line == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.started) < progressDelay || now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	p.line.Show(fmt.Sprintf("%d/%d %s (%d%%)", done, p.total, p.unit, done*100/max(p.total, 1)))
}

// done clears the progress line, if one was shown.
func (p *itemProgress) done() {
	if p.line != nil {
		p.line.Clear()
	}
}
