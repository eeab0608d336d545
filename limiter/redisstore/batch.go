package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// The batcher: callers put their requests on r.queue; each worker takes one (waiting
// for it), then whatever else is already waiting, up to r.batch, and sends them in
// one round trip. A lone caller thus goes out at once, and concurrent callers share
// round trips. On a standalone or Sentinel client, the requests of a batch that share
// a script also share one EVALSHA (see scripts.go): Redis then does a third
// less work per decision.

// redisCall is one EVALSHA: the decisions of one batch that run one script.
type redisCall struct {
	script *script
	reqs   []*redisRequest
	keys   []string
	args   []any
	cmd    *redis.Cmd
	err    error  // loading the script failed
	one    [1]any // the reply of a one-decision call, as a list of one
}

// lua is the script the call runs: the one-decision script for a single decision.
func (c *redisCall) lua() *redis.Script {
	if len(c.reqs) == 1 {
		return c.script.one
	}
	return c.script.many
}

func (r *Store) worker() {
	defer r.wg.Done()
	batch := make([]*redisRequest, 0, r.batch)
	var calls []redisCall
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
		calls = r.group(batch, calls)
		r.execute(context.Background(), calls, pipe)
		for _, req := range batch {
			req.finish()
		}
		clear(batch)
		for i := range calls {
			c := &calls[i]
			clear(c.reqs)
			clear(c.keys)
			clear(c.args)
			c.cmd, c.err, c.one[0] = nil, nil, nil
		}
	}
}

// group sorts batch into calls, reusing calls' buffers: one per script when the
// client lets one script touch several keys, one per request otherwise.
func (r *Store) group(batch []*redisRequest, calls []redisCall) []redisCall {
	calls = calls[:0]
	for _, req := range batch {
		var c *redisCall
		if r.merge {
			for i := range calls {
				if calls[i].script == req.script {
					c = &calls[i]
					break
				}
			}
		}
		if c == nil {
			if len(calls) < cap(calls) {
				calls = calls[:len(calls)+1]
			} else {
				calls = append(calls, redisCall{})
			}
			c = &calls[len(calls)-1]
			c.script = req.script
			c.reqs, c.keys, c.args = c.reqs[:0], c.keys[:0], c.args[:0]
		}
		c.reqs = append(c.reqs, req)
		c.keys = append(c.keys, req.keys[:req.nkeys]...)
		c.args = append(c.args, req.args[:]...)
	}
	return calls
}

// drain answers the requests still queued at Close.
func (r *Store) drain() {
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

// execute makes calls in one round trip (two when scripts must be loaded) and sets
// each request's reply or error. A single call needs no pipeline (pipe may be nil).
func (r *Store) execute(parent context.Context, calls []redisCall, pipe redis.Pipeliner) {
	ctx, cancel := context.WithTimeout(parent, r.timeout)
	defer cancel()
	sent := r.monoMicros()
	r.run(ctx, pipe, calls, false)

	// Scripts missing from the server's cache (a restart, SCRIPT FLUSH, a new Cluster
	// node): load them and make those calls again.
	var loaded [8]*redis.Script
	nloaded, missing := 0, false
load:
	for i := range calls {
		c := &calls[i]
		if !isNoScript(c.cmd.Err()) {
			continue
		}
		missing = true
		for _, s := range loaded[:nloaded] {
			if s == c.lua() {
				continue load
			}
		}
		loaded[nloaded] = c.lua()
		nloaded++
		if err := c.lua().Load(ctx, r.client).Err(); err != nil {
			for j := range calls {
				if calls[j].lua() == c.lua() {
					calls[j].err = err
				}
			}
		}
	}
	if missing {
		r.run(ctx, pipe, calls, true)
	}

	for i := range calls {
		c := &calls[i]
		err := c.err
		if err == nil {
			err = c.cmd.Err()
		}
		var replies []any
		if err == nil && len(c.reqs) == 1 {
			c.one[0] = c.cmd.Val() // the one-decision script's reply is the decision's
			replies = c.one[:]
		} else if err == nil {
			var ok bool
			if replies, ok = c.cmd.Val().([]any); !ok || len(replies) != len(c.reqs) {
				err = errReply
			}
		}
		for j, req := range c.reqs {
			req.sent = sent
			switch {
			case err != nil:
				req.err = err
			default:
				if e, ok := replies[j].(error); ok {
					req.err = e // about this decision alone
				} else if e := req.reply.parse(req.alg, replies[j]); e != nil {
					req.err = e
				}
			}
		}
	}
}

// run sends calls, pipelined when there are several; again sends only those whose
// script was missing and has been loaded since.
func (r *Store) run(ctx context.Context, pipe redis.Pipeliner, calls []redisCall, again bool) {
	send := func(c *redisCall) bool { return !again || (c.err == nil && isNoScript(c.cmd.Err())) }
	if len(calls) == 1 {
		if c := &calls[0]; send(c) {
			c.cmd = r.client.EvalSha(ctx, c.lua().Hash(), c.keys, c.args...)
		}
		return
	}
	if pipe == nil {
		pipe = r.client.Pipeline()
	}
	for i := range calls {
		if c := &calls[i]; send(c) {
			c.cmd = pipe.EvalSha(ctx, c.lua().Hash(), c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
