package queue

import (
	"errors"
	"testing"
)

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		have, min string
		want      bool
	}{
		{"2.9.10", MinServerVersion, false},
		{"2.10.29", MinServerVersion, false},
		{"2.11.0", MinServerVersion, true},
		{"2.11.0-RC.1", MinServerVersion, true}, // a pre-release counts as its release
		{"v2.12.1", MinScheduleServerVersion, true},
		{"2.11.17", MinScheduleServerVersion, false},
		{"3.0.0", MinScheduleServerVersion, true},
		{"2.100.0", MinScheduleServerVersion, true}, // numbers, not text
		{"10.0.0", "9.99.99", true},
		{"", MinServerVersion, false},
		{"latest", MinServerVersion, false},
		{"2.11", MinServerVersion, false},
	} {
		if got := versionAtLeast(tc.have, tc.min); got != tc.want {
			t.Errorf("versionAtLeast(%q, %q) = %v, want %v", tc.have, tc.min, got, tc.want)
		}
	}
}

func TestServerVersionError(t *testing.T) {
	err := error(&ServerVersionError{Found: "2.9.10", Needed: MinServerVersion, Feature: "sluice's queues"})
	if !errors.Is(err, ErrServerVersion) {
		t.Error("not ErrServerVersion")
	}
	if got, want := err.Error(), "nats-server 2.9.10 is too old for sluice's queues: it needs nats-server 2.11.0 or later"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// FuzzVersionAtLeast: whatever a server reports as its version, the comparison does
// not panic, a version is at least itself, and a text that is no version is never
// recent enough.
func FuzzVersionAtLeast(f *testing.F) {
	for _, s := range []string{"2.9.10", "2.11.0", "v2.12.1-RC.2", "", "x", "99999999999.1.1", "2.11.0.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		_, ok := parseVersion(v)
		if got := versionAtLeast(v, v); got != ok {
			t.Errorf("versionAtLeast(%q, itself) = %v, parses %v", v, got, ok)
		}
		if !ok && versionAtLeast(v, "0.0.0") {
			t.Errorf("%q is no version, yet at least 0.0.0", v)
		}
	})
}
