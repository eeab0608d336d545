// Package fulldisk gives tests a small real filesystem to fill up: a tmpfs of a
// given size, which statfs, a store's writes and a free-space check all see alike,
// and a ballast file that fills it at once (fallocate), as abruptly as a disk fills.
package fulldisk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size bytes in a temporary directory of t and returns it;
// it is unmounted when the test ends, after the cleanups registered later (the
// processes started on it). Mount skips t where this process may not mount (not
// root, no mount(8)), or fails it when the environment variable CI is "true".
func Mount(t testing.TB, size int64) string {
	t.Helper()
	unavailable := func(err error) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v; CI must run the full-disk tests", err)
		}
		t.Skipf("%v; skipping (CI=true makes this a failure)", err)
	}
	if os.Geteuid() != 0 {
		unavailable(errors.New("mounting a tmpfs needs root"))
	}
	if _, err := exec.LookPath("mount"); err != nil {
		unavailable(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		unavailable(fmt.Errorf("mount tmpfs on %s: %w %s", dir, err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			// Still busy (a process not yet gone): detach it, the kernel frees it once unused.
			if out2, err2 := exec.Command("umount", "-l", dir).CombinedOutput(); err2 != nil {
				t.Errorf("umount %s: %v %s; umount -l: %v %s", dir, err, out, err2, out2)
			}
		}
	})
	return dir
}

// Free is what statfs reports free on the filesystem of dir.
func Free(t testing.TB, dir string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

// Fill writes a ballast file in dir (on the filesystem under test) that leaves at most
// leave bytes free, in one fallocate, and returns its path. What a store writes
// meanwhile can leave less.
func Fill(t testing.TB, dir string, leave uint64) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for {
		free := Free(t, dir)
		if free <= leave {
			return path
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		// Grown from its current size: the store may have taken some of the space meanwhile.
		err := syscall.Fallocate(int(f.Fd()), 0, st.Size, int64(free-leave))
		if err != nil && !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("fallocate: %v", err)
		}
	}
}
