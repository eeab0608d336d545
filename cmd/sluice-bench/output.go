package main

import (
	"encoding/json"
	"flag"
	"io"
	"runtime"
)

// runInfo opens every mode's JSON document: which mode ran, on which Go and how many
// threads. Embedded in a document, its fields are the document's own.
type runInfo struct {
	Mode       string `json:"mode"`
	Go         string `json:"go"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

func newRunInfo(mode string) runInfo {
	return runInfo{Mode: mode, Go: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
}

// writeJSONDoc writes doc as the one indented JSON document of a mode's --json.
func writeJSONDoc(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// outputFlags are the flags every measuring mode has for its output.
type outputFlags struct {
	json bool
	svg  string // "" writes no chart; only the comparison modes have --svg
}

// addOutputFlags defines --json, and --svg when the mode draws a comparison.
func addOutputFlags(fs *flag.FlagSet, comparison bool) *outputFlags {
	o := &outputFlags{}
	fs.BoolVar(&o.json, "json", false, "print one JSON document (the results and the parameters of the run) instead of the table")
	if comparison {
		fs.StringVar(&o.svg, "svg", "", "also write the comparison as an SVG bar chart to `FILE`")
	}
	return o
}
