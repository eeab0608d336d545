package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"

	"github.com/sluicehq/sluice/queue/subscriber"
)

// runDeliveryKey prints the delivery key of a queue (subscriber.DeliveryKey): the
// secret its nats:SUBJECT consumers check orders and sign results with. It derives it
// from the signing key in SLUICE_QUEUE_KEY, read from the environment only (a key on
// the command line shows in process listings); it needs no running sluice.
func runDeliveryKey(name string, stdout, stderr io.Writer) int {
	env, ok := os.LookupEnv("SLUICE_QUEUE_KEY")
	if !ok {
		fmt.Fprintln(stderr, "sluice queue delivery-key: set SLUICE_QUEUE_KEY to sluice's --queue-key (with the embedded NATS: the contents of DATA_DIR/queue.key)")
		return exitUsage
	}
	key, err := parseQueueKey(env)
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue delivery-key: SLUICE_QUEUE_KEY: %v\n", err)
		return exitUsage
	}
	fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(subscriber.DeliveryKey(key, name)))
	return exitOK
}
