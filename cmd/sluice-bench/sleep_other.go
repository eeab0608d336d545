//go:build !linux

package main

import "time"

// preciseSleeper returns time.Sleep: no finer sleep is used on this platform.
func preciseSleeper() func(time.Duration) { return time.Sleep }
