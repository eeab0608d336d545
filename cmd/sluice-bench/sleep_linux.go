package main

import (
	"syscall"
	"time"
)

// preciseSleeper returns a sleep for the calling goroutine's OS thread, which it must
// have locked: nanosleep with the thread's timer slack at 1 ns, so that the kernel wakes
// it within tens of microseconds rather than the millisecond of Go's timers.
func preciseSleeper() func(time.Duration) {
	const prSetTimerSlack = 29
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0); errno != 0 {
		return time.Sleep
	}
	return func(d time.Duration) {
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		_ = syscall.Nanosleep(&ts, nil) // EINTR: a little early, and the caller looks at the clock
	}
}
