package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgDoc is what the tests read back from a chart: it parsed as XML from its first
// byte to its last.
type svgDoc struct {
	widths []float64 // of each <rect class="bar">, in order
	texts  []string  // the character data of every <text>, in order
	names  []string  // every element's name
}

func parseSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	var doc svgDoc
	var text *strings.Builder
	roots := 0
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, data)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
				if tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root element %v", tok.Name)
				}
			}
			depth++
			doc.names = append(doc.names, tok.Name.Local)
			attr := map[string]string{}
			for _, a := range tok.Attr {
				attr[a.Name.Local] = a.Value
			}
			switch {
			case tok.Name.Local == "rect" && attr["class"] == "bar":
				w, err := strconv.ParseFloat(attr["width"], 64)
				if err != nil {
					t.Fatalf("bar width %q: %v", attr["width"], err)
				}
				doc.widths = append(doc.widths, w)
			case tok.Name.Local == "text":
				text = &strings.Builder{}
			}
		case xml.CharData:
			if text != nil {
				text.Write(tok)
			}
		case xml.EndElement:
			depth--
			if tok.Name.Local == "text" && text != nil {
				doc.texts = append(doc.texts, text.String())
				text = nil
			}
		}
	}
	if roots != 1 {
		t.Errorf("%d root elements", roots)
	}
	return doc
}

// readSVG parses the chart a mode wrote to path and checks it has a bar per result.
func readSVG(t *testing.T, path string, results int) svgDoc {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no chart: %v", err)
	}
	doc := parseSVG(t, data)
	if len(doc.widths) != results {
		t.Errorf("%d bars for %d results", len(doc.widths), results)
	}
	return doc
}

func TestWriteSVG(t *testing.T) {
	hostile := `<script>alert("x" & 'y')</script>`
	c := barChart{
		Title:    "a <title> & more",
		Subtitle: "parameters",
		Unit:     "req/s",
		Note:     "ratio: over the reference",
		Bars: []bar{
			{Group: "g1", Label: "reference", Value: 1000, Ratio: 1},
			{Group: "g1", Label: hostile, Value: 2500, Ratio: 2.5, Sluice: true},
			{Group: "g2", Label: "small", Value: 12.5},
			{Group: "g2", Label: "control\x01char", Value: 400, Ratio: 0.4},
		},
	}
	var b bytes.Buffer
	if err := writeSVG(&b, c); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	if len(doc.widths) != len(c.Bars) {
		t.Fatalf("%d bars, want %d", len(doc.widths), len(c.Bars))
	}
	for _, name := range doc.names {
		if name == "script" {
			t.Errorf("a label became a <script> element:\n%s", b.String())
		}
	}
	has := func(s string) bool {
		for _, x := range doc.texts {
			if x == s {
				return true
			}
		}
		return false
	}
	for _, want := range []string{hostile, "a <title> & more", "parameters", "ratio: over the reference", "g1", "g2",
		"control\uFFFDchar", "2,500 req/s 2.50x", "1,000 req/s 1.00x", "12.50 req/s", "400 req/s 0.40x", "req/s"} {
		if !has(want) {
			t.Errorf("no text %q in %q", want, doc.texts)
		}
	}

	// Widths: value × plotWidth/axisMax, as drawn (to 0.01).
	l := c.layout()
	if l.axisMax != 2500 {
		t.Errorf("axis to %v, want 2500", l.axisMax)
	}
	for i, br := range c.Bars {
		want := br.Value / l.axisMax * l.plotWidth
		if math.Abs(doc.widths[i]-want) > 0.006 || math.Abs(l.widths[i]-want) > 1e-9 {
			t.Errorf("bar %d: width %v (layout %v), want %v", i, doc.widths[i], l.widths[i], want)
		}
	}
	if got, want := doc.widths[1]/doc.widths[0], 2.5; math.Abs(got-want) > 0.001 {
		t.Errorf("widths in ratio %v, values in ratio %v", got, want)
	}
	// Axis ticks every axisMax/5.
	for _, tick := range []string{"0", "500", "1k", "1.5k", "2k", "2.5k"} {
		if !has(tick) {
			t.Errorf("no tick %q in %q", tick, doc.texts)
		}
	}
}

// TestWriteSVGWraps: a subtitle longer than the chart is wide comes in lines, every
// word kept.
func TestWriteSVGWraps(t *testing.T) {
	var words []string
	for i := range 60 {
		words = append(words, "param"+strconv.Itoa(i))
	}
	var b bytes.Buffer
	if err := writeSVG(&b, barChart{Title: "t", Subtitle: strings.Join(words, " "), Bars: []bar{{Label: "a", Value: 1}}}); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	var got []string
	for _, s := range doc.texts {
		if strings.HasPrefix(s, "param") {
			got = append(got, s)
			if len(s) > (chartWidth-2*chartPad)/chartCharWidth {
				t.Errorf("line of %d characters: %q", len(s), s)
			}
		}
	}
	if len(got) < 2 || strings.Join(got, " ") != strings.Join(words, " ") {
		t.Errorf("subtitle lines %q", got)
	}
}

// TestWriteSVGOddValues: no bars, and values that are not positive numbers, still
// make a document; such bars have no width.
func TestWriteSVGOddValues(t *testing.T) {
	for _, bars := range [][]bar{
		nil,
		{{Label: "zero"}, {Label: "negative", Value: -3}, {Label: "nan", Value: math.NaN()}, {Label: "inf", Value: math.Inf(1)}},
	} {
		var b bytes.Buffer
		if err := writeSVG(&b, barChart{Title: "odd", Bars: bars}); err != nil {
			t.Fatal(err)
		}
		doc := parseSVG(t, b.Bytes())
		if len(doc.widths) != len(bars) {
			t.Errorf("%d bars, want %d", len(doc.widths), len(bars))
		}
		for i, w := range doc.widths {
			if w != 0 {
				t.Errorf("bar %q: width %v", bars[i].Label, w)
			}
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for v, want := range map[float64]float64{0: 1, -5: 1, 0.3: 0.3, 0.31: 0.4, 1: 1, 1.1: 1.2, 2.2: 2.5, 7: 8, 9: 10, 2500: 2500, 2501: 3000, 5_689_069: 6e6, 11_604: 12_000} {
		if got := niceCeil(v); math.Abs(got-want) > 1e-9*want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		s     string
		width int
		want  []string
	}{
		{"", 10, nil},
		{"   ", 10, nil},
		{"one two three", 20, []string{"one two three"}},
		{"one two three", 7, []string{"one two", "three"}},
		{"one averyveryverylongword two", 7, []string{"one", "averyveryverylongword", "two"}},
	} {
		if got := wrap(tc.s, tc.width); !slices.Equal(got, tc.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.s, tc.width, got, tc.want)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for v, want := range map[float64]string{0: "0.00", 9.987: "9.99", 99.994: "99.99", 100: "100", 742.4: "742", 1241: "1,241",
		5_689_069.4: "5,689,069", -2500: "-2,500", math.NaN(): "NaN", math.Inf(1): "+Inf"} {
		if got := formatValue(v); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestFormatTick(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.6000000000000001: "0.6", 400: "400", 250_000: "250k", 1_500_000: "1.5M", 2e9: "2G"} {
		if got := formatTick(v); got != want {
			t.Errorf("formatTick(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestSVGUnwritable: a chart that cannot be written fails the run with a message.
func TestSVGUnwritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "chart.svg")
	_, errOut, code := benchRun(t, "limiter", "--duration", "5ms", "--warmup", "0s", "--keys", "10", "--redis", "", "--svg", path)
	if code != exitFailure || !strings.Contains(errOut, "--svg") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// TestFigures: the charts committed for deploy/figures/README.md (made by the
// commands there) parse and have bars.
func TestFigures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "figures", "*.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no figures in deploy/figures: deploy/figures/README.md shows them")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if doc := parseSVG(t, data); len(doc.widths) == 0 {
			t.Errorf("%s: no bars", f)
		}
	}
}
