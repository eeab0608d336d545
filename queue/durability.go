package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// syncUnknown is what a client outside the system account cannot read.
const syncUnknown = "whether the servers sync each write before acknowledging it (sync_interval: always): " +
	"only the system account or each server's monitoring port (/varz, jetstream.config.sync_always) tells"

// CheckDurability reads what nc's server tells a client and reports whether orders
// acknowledged there would be durable in streams of replicas replicas, as sluice
// declares them (file storage): the server version, cluster and domain; memory
// storage or a single replica on a cluster in the streams of sluice that exist
// already; replicas (1) on a cluster; and, where the connection may ask
// ($SYS.REQ.SERVER.PING.VARZ, the system account only), every server's sync setting.
// It does not see the disks: a disk cache that acknowledges a sync it has not done
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
		if !strings.HasPrefix(name, StreamPrefix) && !strings.HasPrefix(name, KeyStreamPrefix) &&
			name != DeadStream && name != "KV_"+TicketsBucket && name != "KV_"+IdempotencyBucket {
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
	lazy, asked := lazyServers(ctx, nc)
	if !asked {
		d.Unknown = append(d.Unknown, syncUnknown)
	}
	d.Problems = append(d.Problems, lazy...)
	return d, nil
}

// lazyServers asks every server for its configuration ($SYS.REQ.SERVER.PING.VARZ,
// answered only to the system account) and returns one sentence per server that
// acknowledges JetStream writes before syncing them; asked is false when no server
// answered.
func lazyServers(ctx context.Context, nc *nats.Conn) (lazy []string, asked bool) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.VARZ", inbox, nil); err != nil {
		return nil, false
	}
	wait, cancel := context.WithTimeout(ctx, time.Second) // every server that answers does within it
	defer cancel()
	for {
		msg, err := sub.NextMsgWithContext(wait)
		if err != nil {
			break
		}
		var resp struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
			Data struct {
				JetStream struct {
					Config *struct {
						SyncAlways   bool          `json:"sync_always"`
						SyncInterval time.Duration `json:"sync_interval"`
					} `json:"config"`
				} `json:"jetstream"`
			} `json:"data"`
		}
		if json.Unmarshal(msg.Data, &resp) != nil || len(msg.Data) == 0 {
			continue // a "no responders" status, or not a server's answer
		}
		asked = true
		if c := resp.Data.JetStream.Config; c != nil && !c.SyncAlways {
			every := c.SyncInterval
			if every == 0 {
				every = 2 * time.Minute // nats-server's default
			}
			lazy = append(lazy, fmt.Sprintf("server %s acknowledges writes before they are on disk (a sync every %s): a power cut loses the orders of the last interval; set sync_interval: always", resp.Server.Name, every))
		}
	}
	slices.Sort(lazy)
	return lazy, asked
}
