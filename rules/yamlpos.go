package rules

import (
	"bytes"
	"errors"
	"io"

	"go.yaml.in/yaml/v3"
)

// maxSyntaxSearch bounds the bytes that syntaxErrorAt parses in all, so that finding
// a mistake in a large file costs a few parses of it, never one per line.
const maxSyntaxSearch = 2 * MaxFileSize

// syntaxErrorAt returns the line and column (1-based) of the YAML syntax error in
// data, which does not parse. yaml.v3 names only a line, and that the line where the
// construct around the mistake starts (for parser errors the one before it), so a
// missing "}" is reported on the line before it, column unknown. The mistake is where
// the document stops parsing: the first line whose prefix of data (through that line)
// fails, found from yaml.v3's line from on (at or before the mistake) by galloping and
// bisection; then the column after the longest start of that line that still parses
// (an unclosed "{" or quote is found where it opens, a bad indentation at the first
// character of the line). ok is false when the search gives up (its byte budget spent).
func syntaxErrorAt(data []byte, from int) (line, col int, ok bool) {
	ends := lineEnds(data)
	budget := maxSyntaxSearch
	fails := func(n int) bool { // the first n bytes of data fail to parse
		budget -= n
		return !parses(data[:n])
	}
	lineFails := func(l int) bool { return fails(ends[l-1]) } // through line l
	lo := max(from-1, 1)                                      // lines before lo: assumed to parse
	if lo > len(ends) {
		lo = len(ends)
	}
	hi := len(ends) // the whole document fails
	if lo > 1 && lineFails(lo-1) {
		lo = 1 // yaml.v3's line was not at or before the mistake: search them all
	}
	// Gallop from lo to a failing line, then bisect between it and the last that parses.
	for step := 1; lo < hi && budget > 0; step *= 2 {
		if l := min(lo+step-1, hi); lineFails(l) {
			hi = l
			break
		} else {
			lo = l + 1
		}
	}
	for lo < hi && budget > 0 {
		if mid := (lo + hi) / 2; lineFails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if budget <= 0 {
		return 0, 0, false
	}
	line = lo
	start := 0
	if line > 1 {
		start = ends[line-2]
	}
	// The longest start of the line that parses, from the end of the line back.
	text := data[start:ends[line-1]]
	for c := len(bytes.TrimRight(text, "\r\n")); c > 0 && budget > 0; c-- {
		if !fails(start + c) {
			return line, runeColumn(text[:c]) + 1, true
		}
	}
	if budget <= 0 {
		return 0, 0, false
	}
	return line, 1, true
}

// lineEnds returns the offset just after each line of data (its newline included).
func lineEnds(data []byte) []int {
	var ends []int
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}

// runeColumn counts the characters of b, as columns are counted (yaml.Node.Column).
func runeColumn(b []byte) int { return len(bytes.Runes(b)) }

// parses reports whether every YAML document in data parses.
func parses(data []byte) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil {
			return false
		}
	}
}
