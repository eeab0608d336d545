package queue_test

import (
	"testing"

	"github.com/sluicehq/sluice/queue/embedded"
)

// The embedded server reads its disk's free space (statfs; Linux only, where CI runs).
func TestEmbeddedDiskFree(t *testing.T) {
	emb, err := embedded.Start(embedded.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Shutdown()
	if free, err := emb.DiskFree(); err != nil || free == 0 {
		t.Fatalf("free %d, %v", free, err)
	}
}
