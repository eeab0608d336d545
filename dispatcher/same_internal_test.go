package dispatcher

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/fieldtest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestSameQueueConfigFields holds sameQueueConfig to every field of
// queueconfig.Config: each is compared (a runner redoes its set-up and takes the new
// config when it alone changes) or ignored for the reason given. A setting added to
// queues fails here until it is put in one list or the other.
func TestSameQueueConfigFields(t *testing.T) {
	base := queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), MaxInFlight: 4, MaxAttempts: 3,
		Backoff: queueconfig.Backoff{Initial: time.Second, Max: time.Minute}, Downstream: "http://127.0.0.1:9000",
		Delivery: queueconfig.AtLeastOnce}
	compared := []string{
		"Outflow", "MaxInFlight", "Downstream", "Delivery", "MaxAttempts", "Backoff", "FairBy", "FairLanes",
		"Priorities", "FlowBy", "MaxAge", "ResultHeaders",
	}
	const parking = "the stream's or the parking's (queue.Store declares and enforces it): a runner sets nothing up from it"
	const callbacks = "callbacks read the queue's current config when they are sent"
	ignored := map[string]string{
		"Name":               "a runner serves one queue, found by its name",
		"MaxDepth":           parking,
		"MaxBytes":           parking,
		"Replicas":           parking,
		"DuplicateWindow":    parking,
		"IdempotencyTTL":     parking,
		"MaxBody":            parking,
		"DropHeaders":        parking,
		"DeadLetterMaxAge":   parking,
		"MaxIdempotencyKeys": parking,
		"TenantMaxDepth":     parking,
		"MaxDelay":           parking,
		"Delay":              "parking writes the due time it gives into each order, which the runner reads",
		"CallbackHosts":      callbacks,
		"CallbackPrivate":    callbacks,
		"CallbackSecret":     callbacks,
	}
	fieldtest.Check(t, "sameQueueConfig", sameQueueConfig, base, compared, ignored)
}
