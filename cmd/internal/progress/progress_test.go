package progress

import (
	"os"
	"strings"
	"testing"
)

func TestLineOffTerminal(t *testing.T) {
	var b strings.Builder
	l := New(&b)
	if l.Terminal() {
		t.Fatal("a strings.Builder is not a terminal")
	}
	l.Show("1/2")
	l.Show("2/2")
	l.Clear()
	l.End()
	if got, want := b.String(), "1/2\n2/2\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

func TestLineOnTerminal(t *testing.T) {
	var b strings.Builder
	l := &Line{w: &b, terminal: true}
	l.Clear() // nothing shown: nothing written
	l.Show("1/2")
	l.Show("2/2")
	l.Clear()
	l.Show("done")
	l.End()
	l.End()
	if got, want := b.String(), "\r\033[K1/2\r\033[K2/2\r\033[K\r\033[Kdone\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

func TestIsTerminal(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("/dev/null counted as a terminal")
	}
	tmp, err := os.CreateTemp(t.TempDir(), "p")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	if IsTerminal(tmp) {
		t.Error("a regular file counted as a terminal")
	}
}
