//go:build linux

package main

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTick is the unit of the CPU times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// childCPU returns the CPU time (user and system) process pid has used so far, and
// whether it could be read. Its resolution is a clock tick.
func childCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: the fields that follow
	// its closing parenthesis are state (3), ..., utime (14) and stime (15).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}
