package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mdLink is a Markdown link or image: [text](target), the target without spaces.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)

// TestMarkdownLinks: every relative link and anchor of README.md and deploy/**/*.md
// leads somewhere: the file or directory exists, and #anchor is a heading of the
// target (or of the page itself), as GitHub names headings.
func TestMarkdownLinks(t *testing.T) {
	pages := []string{filepath.Join("..", "README.md")}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 3 {
		t.Fatalf("only %v", pages)
	}
	anchors := map[string]map[string]bool{} // page → its headings' anchors
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		anchors[page] = headingAnchors(string(b))
		return anchors[page]
	}
	links := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				t.Errorf("%s: link %q: an anchor into a file that is not Markdown", page, target)
			} else if !anchorsOf(file)[anchor] {
				t.Errorf("%s: link %q: %s has no heading with that anchor", page, target, file)
			}
		}
	}
	if links < 20 {
		t.Errorf("only %d relative links found: is the pattern right?", links)
	}
}

// TestHeadingAnchors pins the naming the link test relies on.
func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors("# sluice\n## The `sluice` binary\n```\n# not a heading\n```\n### Tracing (OpenTelemetry)\n## Envoy, Istio and ext_authz\n## Differences from envoyproxy/ratelimit\n## Figures\n## Figures\n")
	for _, want := range []string{"sluice", "the-sluice-binary", "tracing-opentelemetry", "envoy-istio-and-ext_authz",
		"differences-from-envoyproxyratelimit", "figures", "figures-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block is taken for a heading")
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown page:
// lower case, punctuation other than - and _ dropped, spaces as dashes, a repeated one
// numbered -1, -2….
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	heading := regexp.MustCompile(`^#{1,6} (.*)$`)
	for _, line := range strings.Split(withoutCode(md), "\n") {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// withoutCode blanks the fenced code blocks of a Markdown page (their lines stay, empty).
func withoutCode(md string) string {
	lines := strings.Split(md, "\n")
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fence = !fence
			lines[i] = ""
			continue
		}
		if fence {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}
