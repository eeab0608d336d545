package rules

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Sentinel errors that callers branch on. Load wraps them (and watch.New).
var (
	// ErrInvalid is matched (errors.Is) by the Problems a rules set fails with: the
	// files were read but are not a valid rules set, so the set was not activated.
	ErrInvalid = errors.New("invalid rules")
	// ErrNoPaths is returned when Load (or watch.New) is given no path at all.
	ErrNoPaths = errors.New("no rules files given")
)

// Problem is one thing wrong with a rules set, located in its file. Line and Col are
// 1-based; they are 0 when the problem concerns the whole file (it cannot be read, for
// example).
type Problem struct {
	File string
	Line int
	Col  int
	Msg  string
}

// String formats p as FILE:LINE:COL: message, or FILE: message without a position.
func (p Problem) String() string {
	if p.Line == 0 {
		return p.File + ": " + p.Msg
	}
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Col, p.Msg)
}

// Problems is every problem found in a rules set, sorted by file, line and column. As an
// error it prints one problem per line and matches ErrInvalid.
type Problems []Problem

func (ps Problems) Error() string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrInvalid) true for any Problems.
func (ps Problems) Is(target error) bool { return target == ErrInvalid }

// maxProblems caps how many problems one load reports: a garbage file can produce one per
// node, and nobody reads past the first screenfuls.
const maxProblems = 500

// problemList collects problems while a set is loaded.
type problemList struct {
	list    Problems
	dropped int
}

func (l *problemList) add(file string, line, col int, format string, args ...any) {
	if len(l.list) >= maxProblems {
		l.dropped++
		return
	}
	l.list = append(l.list, Problem{File: file, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

// full reports whether further problems would be dropped, so callers can skip work.
func (l *problemList) full() bool { return len(l.list) >= maxProblems }

// result sorts the problems and returns them, or nil when there are none.
func (l *problemList) result() error {
	if len(l.list) == 0 {
		return nil
	}
	slices.SortStableFunc(l.list, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	if l.dropped > 0 {
		last := l.list[len(l.list)-1]
		l.list = append(l.list, Problem{File: last.File, Msg: fmt.Sprintf("%d more problems not shown", l.dropped)})
	}
	return l.list
}
