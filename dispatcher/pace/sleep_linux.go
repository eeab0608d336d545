//go:build linux

package pace

import (
	"syscall"
	"time"
)

// preciseSleep blocks the calling thread in nanosleep(2); the Go scheduler hands the
// processor to other goroutines meanwhile.
func preciseSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		err := syscall.Nanosleep(&ts, &rem)
		if err != syscall.EINTR {
			return
		}
		ts = rem
	}
}
