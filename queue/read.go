package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// directWait bounds a direct get. Every replica of a stream with AllowDirect answers
// direct gets, the requests spread over them; a replica on a stuck server (SIGSTOP, a
// partition that keeps its routes up) answers none until the cluster's routes notice,
// which takes them minutes. A healthy replica answers in milliseconds, so after
// directWait the read asks the stream's leader instead (see readMsg).
const directWait = time.Second

// readMsg reads q from stream: a direct get, answered by any replica, and when that
// one does not answer within directWait, the stream leader's message API (no
// replica but the leader answers it). Errors are the jetstream package's:
// jetstream.ErrMsgNotFound for no such message.
func (s *Store) readMsg(ctx context.Context, stream jetstream.Stream, q jsproto.MsgQuery) (*jetstream.RawStreamMsg, error) {
	if readsFromLeader(ctx) {
		return jsproto.LeaderMsg(ctx, s.nc, stream.CachedInfo().Config.Name, q)
	}
	dctx, cancel := context.WithTimeout(ctx, directWait)
	var (
		raw *jetstream.RawStreamMsg
		err error
	)
	switch {
	case q.Last != "":
		raw, err = stream.GetLastMsgForSubject(dctx, q.Last)
	case q.Next != "":
		raw, err = stream.GetMsg(dctx, q.Seq, jetstream.WithGetMsgSubject(q.Next))
	default:
		raw, err = stream.GetMsg(dctx, q.Seq)
	}
	cancel()
	if !jsproto.NoAnswer(err) || ctx.Err() != nil {
		return raw, err
	}
	name := stream.CachedInfo().Config.Name
	s.log.Debug("a replica did not answer a direct get; asking the stream leader", "stream", name)
	return jsproto.LeaderMsg(ctx, s.nc, name, q)
}

// fromLeader is the context key of leaderReads.
type fromLeader struct{}

// leaderReads returns a context in which readMsg and readKey ask the stream's leader
// instead of any replica. A direct get of a replicated stream may be answered by a
// follower that has not applied the latest writes yet (an order parked a moment ago),
// so a miss there does not prove that a message is absent; the leader's answer does.
func leaderReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, fromLeader{}, true)
}

func readsFromLeader(ctx context.Context) bool { return ctx.Value(fromLeader{}) != nil }

// readKey is kv.Get(ctx, key) that, like readMsg, asks the bucket's stream leader when
// the replica a direct get went to does not answer. Errors are the jetstream
// package's: jetstream.ErrKeyNotFound for a key without a value (never written,
// deleted, purged or expired).
func (s *Store) readKey(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	bucket := kv.Bucket()
	if !readsFromLeader(ctx) {
		dctx, cancel := context.WithTimeout(ctx, directWait)
		e, err := kv.Get(dctx, key)
		cancel()
		if !jsproto.NoAnswer(err) || ctx.Err() != nil {
			return e, err
		}
		s.log.Debug("a replica did not answer a direct get; asking the bucket's stream leader", "bucket", bucket)
	}
	raw, err := jsproto.LeaderMsg(ctx, s.nc, jsproto.KVStream(bucket), jsproto.MsgQuery{Last: jsproto.KVSubject(bucket, key)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, err
	}
	// As the jetstream package reads an entry: an operation header, or a server's
	// delete marker, means no value.
	if raw.Header.Get("KV-Operation") != "" || raw.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil, jetstream.ErrKeyNotFound
	}
	return leaderEntry{bucket: bucket, key: key, raw: raw}, nil
}

// leaderEntry is a key's value read from its bucket's stream leader.
type leaderEntry struct {
	bucket, key string
	raw         *jetstream.RawStreamMsg
}

func (e leaderEntry) Bucket() string                  { return e.bucket }
func (e leaderEntry) Key() string                     { return e.key }
func (e leaderEntry) Value() []byte                   { return e.raw.Data }
func (e leaderEntry) Revision() uint64                { return e.raw.Sequence }
func (e leaderEntry) Created() time.Time              { return e.raw.Time }
func (e leaderEntry) Delta() uint64                   { return 0 } // not known from one message
func (e leaderEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
