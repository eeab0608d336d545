package dispatcher

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

func TestRetryDelay(t *testing.T) {
	b := queueconfig.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempts := 1; attempts <= 10; attempts++ {
		ideal := min(b.Initial<<(attempts-1), b.Max)
		for range 50 {
			d := retryDelay(b, attempts)
			if d <= 0 || d < ideal/2 || d > min(ideal*3/2, b.Max) {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", attempts, d, ideal/2, min(ideal*3/2, b.Max))
			}
		}
	}
}
