//go:build !linux

package pace

import "time"

func preciseSleep(d time.Duration) { time.Sleep(d) }
