package queue

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// Durability is what a client can tell about whether the JetStream it is connected to
// keeps an order it acknowledged through a crash of its servers' hosts, a power cut
// included (see CheckDurability).
type Durability struct {
	// Version of the server the connection is on, its cluster ("": a single server),
	// the servers the connection knows of (the cluster's, as the server announced
	// them), and the account's JetStream domain.
	Version string
	Cluster string
	Servers int
	Domain  string
	// Problems are the reasons an acknowledged order is not durable, each a sentence.
	Problems []string
	// Unknown names what could not be checked from this connection.
	Unknown []string
}

// syncUnknown is what no client of a JetStream account can read: only the system
// account, which has no JetStream, may ask the servers' configuration
// ($SYS.REQ.SERVER.PING.VARZ; a publish there from sluice's account is a permissions
// violation under the shipped permissions).
const syncUnknown = "whether the servers sync each write before acknowledging it (sync_interval: always): " +
	"each server's monitoring port tells (/varz: jetstream.config.sync_always)"

// CheckDurability reads what nc's server tells a client and reports whether orders
// acknowledged there would be durable in streams of replicas replicas, as sluice
// declares them (file storage): the server version, cluster and domain; memory
// storage or a single replica on a cluster in the streams of sluice that exist
// already, but for the key streams (in memory by design: see Store.keyStream); and
// replicas (1) on a cluster. The servers' sync setting cannot be read by
// a client of a JetStream account: it is always among Unknown. Nor does it see the
// disks: a disk cache that acknowledges a sync it has not done
// (a RAID controller without a battery, some virtual disks, a network file system)
// loses orders whatever the setting. An error: nothing could be read (not connected).
func CheckDurability(ctx context.Context, nc *nats.Conn, replicas int) (Durability, error) {
	d := Durability{Version: nc.ConnectedServerVersion(), Cluster: nc.ConnectedClusterName(), Servers: max(len(nc.Servers()), 1)}
	js, err := jetstream.New(nc)
	if err != nil {
		return d, err
	}
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return d, fmt.Errorf("queue: JetStream account: %w", err)
	}
	d.Domain = info.Domain
	clustered := d.Cluster != ""
	if clustered && replicas == 1 {
		d.Problems = append(d.Problems, fmt.Sprintf("the queues get one replica (--replicas 1) on cluster %s: an order is on one node's disk only, lost with it", d.Cluster))
	}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		// Not the key streams: their slots are in memory by design (see Store.keyStream).
		if !strings.HasPrefix(name, StreamPrefix) && name != DeadStream && name != jsproto.KVStream(TicketsBucket) && name != jsproto.KVStream(IdempotencyBucket) {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			d.Unknown = append(d.Unknown, "stream "+name+": "+err.Error())
			continue
		}
		cfg := s.CachedInfo().Config
		switch {
		case cfg.Storage == jetstream.MemoryStorage:
			d.Problems = append(d.Problems, fmt.Sprintf("stream %s keeps its messages in memory: a restart of its servers loses them", name))
		case clustered && cfg.Replicas == 1:
			d.Problems = append(d.Problems, fmt.Sprintf("stream %s has one replica on cluster %s: its messages are on one node's disk only", name, d.Cluster))
		}
	}
	if err := names.Err(); err != nil {
		d.Unknown = append(d.Unknown, "sluice's streams: "+err.Error())
	}
	d.Unknown = append(d.Unknown, syncUnknown)
	return d, nil
}
