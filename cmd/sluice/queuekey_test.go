package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestLoadQueueKey(t *testing.T) {
	dir := t.TempDir()
	key, err := loadQueueKey(dir)
	if err != nil || len(key) != 32 {
		t.Fatalf("new key: %d bytes, %v", len(key), err)
	}
	path := filepath.Join(dir, queueKeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".queue.key-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	again, err := loadQueueKey(dir)
	if err != nil || !bytes.Equal(again, key) {
		t.Fatalf("second load: %v", err)
	}
	if other, _ := loadQueueKey(t.TempDir()); bytes.Equal(other, key) {
		t.Error("two directories got the same key")
	}

	// What the file must not be: each refused with a message naming it, and left
	// as it is (orders were signed with it).
	good := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "\n"
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"readable by others", good, 0o644, "may be read by others (mode 0644)"},
		{"readable by the group", good, 0o640, "may be read by others"},
		{"not base64", "not a key\n", 0o600, "not base64"},
		{"too short", base64.StdEncoding.EncodeToString([]byte("short")), 0o600, "5 bytes, want at least 32"},
		{"empty", "", 0o600, "0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if runtime.GOOS == "windows" && tc.mode != 0o600 {
				t.Skip("no permission bits")
			}
			dir := t.TempDir()
			path := filepath.Join(dir, queueKeyFile)
			if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			_, err := loadQueueKey(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err %v, want %q and the path", err, tc.want)
			}
			if b, _ := os.ReadFile(path); string(b) != tc.content {
				t.Error("the key file was changed")
			}
		})
	}
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "k")
		if err := os.WriteFile(target, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, queueKeyFile)); err != nil {
			if runtime.GOOS == "linux" { // where CI runs: the refusal must be tested
				t.Fatal(err)
			}
			t.Skip(err)
		}
		if _, err := loadQueueKey(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestParseQueueKey(t *testing.T) {
	raw := bytes.Repeat([]byte{0xfb}, 40)
	for _, tc := range []struct {
		in   string
		want []byte
	}{
		{base64.StdEncoding.EncodeToString(raw), raw},
		{base64.RawStdEncoding.EncodeToString(raw[:32]), raw[:32]},
		{" " + base64.StdEncoding.EncodeToString(raw) + "\n", raw},
		{base64.URLEncoding.EncodeToString(raw), nil}, // one alphabet, documented
		{base64.StdEncoding.EncodeToString(raw[:31]), nil},
	} {
		got, err := parseQueueKey(tc.in)
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%q: accepted", tc.in)
		case tc.want != nil && (err != nil || !bytes.Equal(got, tc.want)):
			t.Errorf("%q: %x %v", tc.in, got, err)
		}
	}
}

// TestConsoleToken: made once (0600), reused after; a file others may read, a symlink
// or one that is not a token is refused, never replaced or followed.
func TestConsoleToken(t *testing.T) {
	dir := t.TempDir()
	tok, created, err := loadConsoleToken(dir)
	if err != nil || !created || len(tok) != 43 {
		t.Fatalf("first: %q %v %v", tok, created, err)
	}
	again, created, err := loadConsoleToken(dir)
	if err != nil || created || again != tok {
		t.Fatalf("again: %q %v %v, want %q", again, created, err, tok)
	}
	path := filepath.Join(dir, consoleTokenFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadConsoleToken(dir); err == nil || !strings.Contains(err.Error(), "may be read by others (mode 0644)") {
		t.Errorf("mode 0644: %v", err)
	}
	for name, content := range map[string]string{"empty": "", "short": "abc\n", "two words": "0123456789abcdef 0123456789abcdef\n"} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, consoleTokenFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadConsoleToken(d); err == nil || !strings.Contains(err.Error(), "is not a token") {
			t.Errorf("%s: %v", name, err)
		}
	}
	d := t.TempDir()
	if err := os.Symlink(path, filepath.Join(d, consoleTokenFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadConsoleToken(d); err == nil || !strings.Contains(err.Error(), "is not a regular file") {
		t.Errorf("symlink: %v", err)
	}
}

func TestConsoleURL(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9090": "http://127.0.0.1:9090/console/",
		"[::]:9090":      "http://127.0.0.1:9090/console/",
		"0.0.0.0:9090":   "http://127.0.0.1:9090/console/",
		"[::1]:9090":     "http://[::1]:9090/console/",
	} {
		if got := consoleURL(addr); got != want {
			t.Errorf("consoleURL(%q) = %q, want %q", addr, got, want)
		}
	}
}
