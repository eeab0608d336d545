package warn

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSometimes(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := Every(time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				w.Warn(log, "deferring failed", "queue", "orders")
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "held_back=0") || !strings.Contains(lines[0], "queue=orders") {
		t.Fatalf("200 warnings within the interval gave %d lines, want the first only:\n%s", len(lines), buf.String())
	}
	// Once the interval has passed, the next line counts the ones held back.
	w.interval = time.Nanosecond
	time.Sleep(time.Millisecond)
	w.Warn(log, "deferring failed", "queue", "orders")
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "held_back=199") {
		t.Fatalf("the line after the interval, want held_back=199:\n%s", buf.String())
	}
}
