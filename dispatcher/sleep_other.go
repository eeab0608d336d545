//go:build !linux

package dispatcher

import "time"

func preciseSleep(d time.Duration) { time.Sleep(d) }
