package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// barChart is one comparison drawn as horizontal bars on one linear axis from 0: a
// bar per row of the mode's table, its main throughput figure.
type barChart struct {
	Title    string // the mode and what is measured
	Subtitle string // the parameters of the run
	Unit     string // of the values, e.g. "decisions/s"
	Note     string // what the ratios printed next to the bars are relative to
	Bars     []bar
}

// bar is one contender. Bars with the same Group are drawn under one heading, which
// is drawn when Group differs from the previous bar's.
type bar struct {
	Group string
	Label string
	Value float64
	// Ratio is Value over the reference contender's (1 for the reference itself);
	// 0 prints no ratio (a row without a reference).
	Ratio float64
	// Sluice marks sluice's own contenders, drawn in a colour of their own.
	Sluice bool
}

// Chart geometry, in SVG user units (pixels).
const (
	chartWidth     = 960
	chartPad       = 16
	chartRow       = 24 // height of one bar's row
	chartBar       = 16 // height of one bar
	chartGroupRow  = 22 // height of a group heading
	chartCharWidth = 7  // rough width of one character at font-size 12, to size the label column
	chartValueCol  = 200
	chartTicks     = 5
)

// chartLayout is where writeSVG puts things; the tests check it against the values.
type chartLayout struct {
	plotX, plotWidth float64   // the axis starts at plotX and is plotWidth long
	axisMax          float64   // the value at the axis' right end
	widths           []float64 // of each bar, in the order of Bars
}

// layout scales the axis to a round number at or above the largest value, so every
// bar's width is its value times plotWidth/axisMax. Values that are not positive
// numbers (0, negative, NaN, ±Inf) get no bar.
func (c barChart) layout() chartLayout {
	longest := 0
	for _, b := range c.Bars {
		longest = max(longest, len([]rune(b.Label)))
	}
	labelCol := float64(min(max(longest, 8), 48)*chartCharWidth + chartPad)
	l := chartLayout{plotX: chartPad + labelCol}
	l.plotWidth = chartWidth - chartPad - chartValueCol - l.plotX
	top := 0.0
	for _, b := range c.Bars {
		if drawable(b.Value) {
			top = max(top, b.Value)
		}
	}
	l.axisMax = niceCeil(top)
	for _, b := range c.Bars {
		w := 0.0
		if drawable(b.Value) {
			w = b.Value / l.axisMax * l.plotWidth
		}
		l.widths = append(l.widths, w)
	}
	return l
}

func drawable(v float64) bool { return v > 0 && !math.IsInf(v, 1) }

// niceCeil is the least of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten
// that is at least v (1 when v is not positive): a fifth of each is a round number
// for the ticks, and the longest bar fills at least 4/5 of the axis.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// writeSVG writes c as a standalone SVG document. Every text from the chart goes
// through xml.EscapeText, so labels are text whatever they contain.
func writeSVG(w io.Writer, c barChart) error {
	l := c.layout()
	var b strings.Builder
	y := float64(chartPad)
	rows := 0
	var group string
	for i, br := range c.Bars {
		if br.Group != "" && (i == 0 || br.Group != group) {
			rows += chartGroupRow
		}
		group = br.Group
		rows += chartRow
	}
	// The subtitle and the note wrap at the chart's width, a line under another.
	maxChars := (chartWidth - 2*chartPad) / chartCharWidth
	var lines []string
	for _, l := range [][]string{wrap(c.Subtitle, maxChars), wrap(c.Note, maxChars)} {
		lines = append(lines, l...)
	}
	height := chartPad + 20 + 18*len(lines) + 8 + rows + 40 + chartPad
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	y += 16
	fmt.Fprintf(&b, `<text class="title" x="%d" y="%.0f" font-size="16" font-weight="bold">%s</text>`+"\n", chartPad, y, esc(c.Title))
	for _, l := range lines {
		y += 18
		fmt.Fprintf(&b, `<text class="subtitle" x="%d" y="%.0f" fill="#444444">%s</text>`+"\n", chartPad, y, esc(l))
	}
	y += 8
	plotTop := y

	// Grid lines first, so the bars are drawn over them.
	plotBottom := plotTop + float64(rows)
	for i := 0; i <= chartTicks; i++ {
		x := l.plotX + float64(i)*l.plotWidth/chartTicks
		fmt.Fprintf(&b, `<line class="grid" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#e0e0e0"/>`+"\n", x, plotTop, x, plotBottom)
	}
	group = ""
	for i, br := range c.Bars {
		if br.Group != "" && (i == 0 || br.Group != group) {
			fmt.Fprintf(&b, `<text class="group" x="%d" y="%.2f" font-weight="bold">%s</text>`+"\n", chartPad, y+15, esc(br.Group))
			y += chartGroupRow
		}
		group = br.Group
		fill := "#8c8c8c"
		if br.Sluice {
			fill = "#1f6fb2"
		}
		mid := y + chartRow/2
		fmt.Fprintf(&b, `<text class="label" x="%.2f" y="%.2f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n",
			l.plotX-6, mid, esc(br.Label))
		fmt.Fprintf(&b, `<rect class="bar" x="%.2f" y="%.2f" width="%.2f" height="%d" fill="%s"/>`+"\n",
			l.plotX, y+(chartRow-chartBar)/2, l.widths[i], chartBar, fill)
		value := formatValue(br.Value)
		if c.Unit != "" {
			value += " " + c.Unit
		}
		ratio := ""
		if br.Ratio > 0 {
			// SVG collapses spaces: dx keeps the ratio apart from the value.
			ratio = fmt.Sprintf(` <tspan class="ratio" dx="6" font-weight="bold">%.2fx</tspan>`, br.Ratio)
		}
		fmt.Fprintf(&b, `<text class="value" x="%.2f" y="%.2f" dominant-baseline="middle">%s%s</text>`+"\n",
			l.plotX+l.widths[i]+6, mid, esc(value), ratio)
		y += chartRow
	}

	// The axis: a line, a tick and a round number every axisMax/chartTicks.
	fmt.Fprintf(&b, `<line class="axis" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#000000"/>`+"\n",
		l.plotX, plotBottom, l.plotX+l.plotWidth, plotBottom)
	for i := 0; i <= chartTicks; i++ {
		x := l.plotX + float64(i)*l.plotWidth/chartTicks
		fmt.Fprintf(&b, `<line class="tick" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#000000"/>`+"\n", x, plotBottom, x, plotBottom+5)
		fmt.Fprintf(&b, `<text class="tick-label" x="%.2f" y="%.2f" text-anchor="middle">%s</text>`+"\n",
			x, plotBottom+18, esc(formatTick(l.axisMax*float64(i)/chartTicks)))
	}
	fmt.Fprintf(&b, `<text class="unit" x="%.2f" y="%.2f" text-anchor="middle" fill="#444444">%s</text>`+"\n",
		l.plotX+l.plotWidth/2, plotBottom+34, esc(c.Unit))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks s at spaces into lines of at most width runes (a longer word is a
// line of its own); "" is no line.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// writeSVGFile writes c to path, creating or truncating it.
func writeSVGFile(path string, c barChart) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeSVG(f, c); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// esc makes s safe as XML text or attribute value: markup characters become
// references and characters XML forbids become U+FFFD.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

// formatValue writes a bar's value: whole numbers with thousands separators from
// 100 up (where decimals are noise in a throughput), two decimals below.
func formatValue(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'f', -1, 64)
	case math.Abs(v) >= 100:
		s := count(int(math.Abs(math.Round(v))))
		if v < 0 {
			s = "-" + s
		}
		return s
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// formatTick writes an axis value short: 0, 2.5, 400, 250k, 1.5M.
func formatTick(v float64) string {
	v = math.Round(v*1e6) / 1e6 // 0.6, not 0.6000000000000001
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return strconv.FormatFloat(v/u.div, 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
