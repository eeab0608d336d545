//go:build !linux

package main

import "time"

// childCPU reports that the platform does not tell another process's CPU time here.
func childCPU(int) (time.Duration, bool) { return 0, false }
