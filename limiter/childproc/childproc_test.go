package childproc

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestStart(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	tests := []struct {
		name    string
		script  string
		ready   func() bool
		timeout time.Duration
		wantErr error // nil: ready
		wantLog string
	}{
		{"ready", "echo up; sleep 60", func() bool { return true }, time.Minute, nil, ""},
		{"exits", "echo boom >&2; exit 3", func() bool { return false }, time.Minute, ErrExited, "boom"},
		{"never ready", "sleep 60", func() bool { return false }, 50 * time.Millisecond, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := filepath.Join(dir, tt.name+".log")
			p, err := Start(exec.Command("sh", "-c", tt.script), log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Kill)
			err = p.WaitReady(context.Background(), tt.timeout, 5*time.Millisecond, tt.ready)
			switch {
			case tt.name == "never ready":
				if err == nil || !strings.Contains(err.Error(), "not ready within") {
					t.Errorf("WaitReady = %v, want a timeout", err)
				}
				if !p.Running() {
					t.Error("a timeout killed the process; the caller decides")
				}
			case !errors.Is(err, tt.wantErr):
				t.Errorf("WaitReady = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				<-p.Exited()
				if got := Tail(log, 100); !strings.Contains(got, tt.wantLog) {
					t.Errorf("log %q lacks %q", got, tt.wantLog)
				}
			}
		})
	}
}

func TestStartMissingBinary(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/server"), filepath.Join(t.TempDir(), "log")); err == nil {
		t.Error("Start of a missing binary succeeded")
	}
}

func TestWaitReadyContext(t *testing.T) {
	p, err := Start(exec.Command("sleep", "60"), filepath.Join(t.TempDir(), "log"))
	if err != nil {
		if runtime.GOOS == "linux" { // where CI runs: sleep is there
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(p.Kill)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.WaitReady(ctx, time.Minute, time.Millisecond, func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitReady = %v, want context.Canceled", err)
	}
	p.Kill()
	if p.Running() {
		t.Error("Running after Kill")
	}
}
