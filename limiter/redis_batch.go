package limiter

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// The batcher: callers put their requests on r.queue; each worker takes one (waiting
// for it), then whatever else is already waiting, up to r.batch, and sends them as
// one pipeline. A lone caller thus goes out at once, and concurrent callers share
// round trips.

func (r *Redis) worker() {
	defer r.wg.Done()
	batch := make([]*redisRequest, 0, r.batch)
	cmds := make([]*redis.Cmd, 0, r.batch)
	pipe := r.client.Pipeline()
	for {
		batch = batch[:0]
		select {
		case req := <-r.queue:
			batch = append(batch, req)
		case <-r.quit:
			r.drain()
			return
		}
	more:
		for len(batch) < r.batch {
			select {
			case req := <-r.queue:
				batch = append(batch, req)
			default:
				break more
			}
		}
		cmds = r.execute(context.Background(), batch, cmds, pipe)
		for _, req := range batch {
			req.finish()
		}
		clear(batch)
		clear(cmds)
	}
}

// drain answers the requests still queued at Close.
func (r *Redis) drain() {
	for {
		select {
		case req := <-r.queue:
			req.err = errClosed
			req.finish()
		default:
			return
		}
	}
}

// execute runs batch in one round trip (two when scripts must be loaded) and sets
// each request's reply or error.
// A batch of one needs no pipeline (pipe may be nil).
func (r *Redis) execute(parent context.Context, batch []*redisRequest, cmds []*redis.Cmd, pipe redis.Pipeliner) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(parent, r.timeout)
	defer cancel()
	sent := r.monoMicros()
	cmds = r.run(ctx, pipe, batch, cmds[:0])

	// Scripts missing from the server's cache (a restart, SCRIPT FLUSH, a new Cluster
	// node): load them and run those requests again.
	var retry []*redisRequest
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, batch[i])
		}
	}
	if len(retry) > 0 {
		var loaded [4]*redis.Script
		nloaded := 0
		var loadErr error
	load:
		for _, req := range retry {
			for _, s := range loaded[:nloaded] {
				if s == req.script {
					continue load
				}
			}
			loaded[nloaded] = req.script
			nloaded++
			if err := req.script.Load(ctx, r.client).Err(); err != nil {
				loadErr = err
			}
		}
		var again []*redis.Cmd
		if loadErr == nil {
			again = r.run(ctx, pipe, retry, nil)
		}
		j := 0
		for i, cmd := range cmds {
			if !isNoScript(cmd.Err()) {
				continue
			}
			if loadErr != nil {
				batch[i].err = loadErr
				cmds[i] = nil
			} else {
				cmds[i] = again[j]
			}
			j++
		}
	}

	for i, req := range batch {
		req.sent = sent
		if cmds[i] == nil {
			continue
		}
		if err := cmds[i].Err(); err != nil {
			req.err = err
			continue
		}
		if err := req.reply.parse(req.alg, cmds[i].Val()); err != nil {
			req.err = err
		}
	}
	return cmds
}

// run sends one EVALSHA per request, pipelined when there are several.
func (r *Redis) run(ctx context.Context, pipe redis.Pipeliner, batch []*redisRequest, cmds []*redis.Cmd) []*redis.Cmd {
	if len(batch) == 1 {
		req := batch[0]
		return append(cmds, r.client.EvalSha(ctx, req.script.Hash(), req.keys[:req.nkeys], req.args[:req.nargs]...))
	}
	if pipe == nil {
		pipe = r.client.Pipeline()
	}
	for _, req := range batch {
		cmds = append(cmds, pipe.EvalSha(ctx, req.script.Hash(), req.keys[:req.nkeys], req.args[:req.nargs]...))
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
