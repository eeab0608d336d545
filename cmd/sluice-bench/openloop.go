package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"time"
)

// openLoopResult is what openLoop measured.
type openLoopResult struct {
	Sent, Failed int
	// Late counts the requests that found no idle connection at their slot and went
	// out when one came back; their latency counts from the slot, not from the send.
	Late int
	// Latencies of the answered requests, sorted.
	Latencies []time.Duration
}

// quantile returns the q-quantile (0 to 1) of the latencies, 0 when there are none.
func (r openLoopResult) quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q * float64(len(r.Latencies)))
	return r.Latencies[min(i, len(r.Latencies)-1)]
}

// openLoop sends GET u at rate requests per second for d, on conns keep-alive HTTP/1.1
// connections opened beforehand, whatever the answers: an open loop, free of
// coordinated omission (a slow answer does not delay the next slot).
//
// One goroutine, on an OS thread of its own, sleeps until the next slot with the
// finest sleep the platform offers (Go's timers round waits below a millisecond up to
// one on Linux, which would send every request in bursts of two or three at 2,000/s),
// then sends every slot due by the time it woke, each request written on an idle
// connection with one write. A request's latency runs from just before its write to
// the end of its response as read by that connection's goroutine: the sleeper's
// lateness in waking, which is the generator's and not the target's, counts in no
// sample. A slot that finds every connection busy waits for one; its latency then
// runs from the slot (see Late).
func openLoop(ctx context.Context, u string, rate, conns int, d time.Duration) (openLoopResult, error) {
	target, err := url.Parse(u)
	if err != nil {
		return openLoopResult{}, err
	}
	if rate < 1 || conns < 1 {
		return openLoopResult{}, errors.New("open loop: the rate and the connections must be positive")
	}
	request := []byte("GET " + target.RequestURI() + " HTTP/1.1\r\nHost: " + target.Host + "\r\nUser-Agent: sluice-bench\r\n\r\n")

	var (
		mu       sync.Mutex
		res      openLoopResult
		all      []*olConn // every connection opened, for the end
		stopping bool      // the run is over: a failed connection is not replaced
		settled  int       // requests answered (whatever the status) or lost with their connection
		wg       sync.WaitGroup
		idle     = make(chan *olConn, conns)
		dialer   = net.Dialer{Timeout: 5 * time.Second}
	)
	// serve reads the answers of c's requests; when c fails, it hands a new
	// connection in its place (or none, when that fails too: the run goes on with
	// one fewer).
	var serve func(c *olConn)
	open := func() (*olConn, error) {
		conn, err := dialer.DialContext(ctx, "tcp", target.Host)
		if err != nil {
			return nil, err
		}
		c := &olConn{conn: conn, br: bufio.NewReader(conn), sentAt: make(chan time.Time, 1)}
		mu.Lock()
		all = append(all, c)
		mu.Unlock()
		wg.Add(1)
		go serve(c)
		return c, nil
	}
	serve = func(c *olConn) {
		defer wg.Done()
		for sent := range c.sentAt {
			status, err := readAnswer(c.br)
			done := time.Now()
			mu.Lock()
			settled++
			if err == nil && status/100 == 2 {
				res.Latencies = append(res.Latencies, done.Sub(sent))
			}
			replace := err != nil && !stopping && ctx.Err() == nil
			mu.Unlock()
			if err != nil {
				_ = c.conn.Close()
				if replace {
					if nc, err := open(); err == nil {
						idle <- nc
					}
				}
				return
			}
			idle <- c
		}
	}
	end := func() {
		mu.Lock()
		stopping = true
		conns := all
		mu.Unlock()
		for _, c := range conns {
			c.close()
		}
		wg.Wait()
	}
	for range conns {
		c, err := open()
		if err != nil {
			end()
			return openLoopResult{}, fmt.Errorf("open loop: %w", err)
		}
		idle <- c
	}

	// The sender: its thread is its own, so that its fine sleeps hold no other
	// goroutine up and its timer settings touch no other thread.
	slots := int(d.Seconds() * float64(rate))
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		sleep := preciseSleeper()
		start := time.Now()
		slot := func(i int) time.Time {
			return start.Add(time.Duration(float64(i) * float64(time.Second) / float64(rate)))
		}
		for i := 0; i < slots && ctx.Err() == nil; {
			if wait := time.Until(slot(i)); wait > 0 {
				sleep(wait)
			}
			for now := time.Now(); i < slots && !slot(i).After(now); i++ {
				var c *olConn
				late := false
				select {
				case c = <-idle:
				default:
					late = true
					select {
					case c = <-idle:
					case <-ctx.Done():
						return
					}
				}
				stamp := time.Now()
				if late {
					stamp = slot(i)
				}
				c.sentAt <- stamp
				mu.Lock()
				res.Sent++
				if late {
					res.Late++
				}
				mu.Unlock()
				if _, err := c.conn.Write(request); err != nil {
					_ = c.conn.Close() // its reader fails and replaces it
				}
			}
		}
	}()
	<-sendDone

	// Every answer in (or its connection broken), or 10 s, whichever is first; then
	// the connections close. A request not answered 2xx counts as failed.
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		pending := res.Sent - settled
		mu.Unlock()
		if pending == 0 || ctx.Err() != nil {
			break
		}
		select {
		case <-deadline:
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	end()
	slices.Sort(res.Latencies)
	res.Failed = res.Sent - len(res.Latencies)
	return res, ctx.Err()
}

// olConn is one connection of the open loop.
type olConn struct {
	conn   net.Conn
	br     *bufio.Reader
	sentAt chan time.Time // one request at a time: when it was sent
}

func (c *olConn) close() {
	_ = c.conn.Close()
	close(c.sentAt)
}

// readAnswer reads one response from br, body included, and returns its status.
func readAnswer(br *bufio.Reader) (int, error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}
