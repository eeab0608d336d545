package rediskeys

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/limiter/redistest"
)

func TestDelete(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	// More keys than one batch, so the flush inside the loop runs too.
	for i := range 2*batch + 7 {
		if err := client.Set(ctx, fmt.Sprintf("sim:{k}:%d", i), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.Set(ctx, "other", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, client, "sim:*"); err != nil {
		t.Fatal(err)
	}
	if n := client.DBSize(ctx).Val(); n != 1 {
		t.Errorf("%d keys left, want only the one outside the pattern", n)
	}
	if client.Exists(ctx, "other").Val() != 1 {
		t.Error("a key outside the pattern was removed")
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := Delete(canceled, client, "*"); err == nil {
		t.Error("Delete with a canceled context returned nil")
	}
}
