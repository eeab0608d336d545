package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The fuzzers check that the parsers never panic and that whatever they accept is
// what the rest of simulate relies on. Seeds live in testdata/fuzz/<FuzzName>/ and here;
// run them for longer with, for example:
//
//	go test -run '^$' -fuzz FuzzParseTrace -fuzztime 30s -fuzzminimizetime 5s ./cmd/sluice
//
// (a short minimisation time keeps the fuzzer fuzzing: minimising a long input that
// merely found new coverage can otherwise take it a minute)

func FuzzParseTrace(f *testing.F) {
	for _, s := range []string{
		"0s\n",
		"0s a\n0s a 2\n1.5s b 1 # comment\n",
		"# only a comment\n\n   \n",
		"1m40s\n1m39s\n",
		"1ns\n",
		"-1s\n",
		"0s a b c\n",
		"0s\t-\t+3\r\n",
		"0s a 0\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 1024 {
			// Long inputs add nothing to a line parser but cost the fuzzer long
			// minimisations; the bufio limit on line length has its own unit test.
			t.Skip()
		}
		reqs, err := parseTrace(strings.NewReader(text))
		if err != nil {
			if te := (*traceError)(nil); errors.As(err, &te) && te.line < 1 {
				t.Fatalf("error names line %d: %v", te.line, err)
			}
			return
		}
		var last time.Duration
		prevLine := 0
		for _, r := range reqs {
			switch {
			case r.offset < last:
				t.Fatalf("offsets go back: %v after %v", r.offset, last)
			case r.offset%time.Microsecond != 0 || r.offset > maxOffset:
				t.Fatalf("offset %v accepted", r.offset)
			case r.n < 1:
				t.Fatalf("n %d accepted", r.n)
			case r.key == "" || strings.ContainsAny(r.key, " \t\n#"):
				t.Fatalf("key %q accepted", r.key)
			case r.line <= prevLine:
				t.Fatalf("line numbers not increasing: %d after %d", r.line, prevLine)
			}
			last, prevLine = r.offset, r.line
		}
	})
}
