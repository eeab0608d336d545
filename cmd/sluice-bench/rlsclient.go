package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// leanConn is a gRPC client connection for unary calls of one method with requests
// encoded in advance: the rls mode's load generator when --client is lean. It speaks
// gRPC over HTTP/2 (cleartext, prior knowledge) as any gRPC client does, Envoy's
// included, but does per call only what a call needs: it copies two prepared frames
// (HEADERS, whose header block is encoded once, and DATA with END_STREAM) into a
// write buffer, which whichever caller finds no write under way writes out with the
// frames of every caller that queued meanwhile; one goroutine reads the frames of
// every stream, decodes header blocks with HPACK (the server's dynamic table
// requires it) and hands each caller its response's bytes. No goroutine, channel or
// context per call, no metadata maps, no retries, no compression.
//
// Flow control: it opens its connection-level receive window to 1 GiB and tops it
// up as it reads; responses are far below a stream's initial window of 64 KiB, and
// so are requests, which wait for the server's connection window. A call waits, too,
// while the server's SETTINGS_MAX_CONCURRENT_STREAMS streams are open.
type leanConn struct {
	nc    net.Conn
	first []byte        // the header block of the first request
	block []byte        // the header block of every later request
	done  chan struct{} // closed when read returns
	// settled is closed when the server's first SETTINGS have been applied.
	settled chan struct{}

	wmu      sync.Mutex
	wcond    sync.Cond // on wmu: the send window grew, a stream closed, or the connection failed
	wbuf     []byte    // frames to write
	spare    []byte    // the other write buffer
	flushing bool      // a goroutine is writing wbuf out
	nextID   uint32
	sendWin  int64  // the server's connection-level window for our DATA
	open     uint32 // streams open: sent and neither answered nor reset
	maxOpen  uint32 // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	err      error  // why the connection is unusable (sticky)

	smu     sync.Mutex
	streams map[uint32]*leanCall
}

// leanCall is one caller's call; a caller makes one call at a time and reuses it.
type leanCall struct {
	done       chan error // the outcome, once per call
	data       []byte     // the DATA received: gRPC's length-prefixed message
	httpStatus string
	grpcStatus string
	grpcMsg    string
}

func newLeanCall() *leanCall { return &leanCall{done: make(chan error, 1)} }

const (
	leanRecvWindow = 1 << 30
	h2FrameData    = 0x0
	h2FrameHeaders = 0x1
	h2FlagEnd      = 0x1 // END_STREAM (DATA, HEADERS), ACK (SETTINGS, PING)
	h2FlagHeaders  = 0x4 // END_HEADERS
)

// dialLean connects to addr and calls method there.
func dialLean(addr, method string) (*leanConn, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	// The request headers: the first request's block adds them to the server's
	// dynamic table (HPACK), after which every request's block is the same handful
	// of indices, as a client reusing its headers sends (Envoy, grpc-go).
	var block []byte
	enc := hpack.NewEncoder(writerFunc(func(p []byte) (int, error) { block = append(block, p...); return len(p), nil }))
	var blocks [2][]byte
	for i := range blocks {
		block = nil
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", addr},
			{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "sluice-bench"},
		} {
			if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
				nc.Close()
				return nil, err
			}
		}
		blocks[i] = block
	}
	c := &leanConn{nc: nc, first: blocks[0], block: blocks[1], done: make(chan struct{}), settled: make(chan struct{}), nextID: 1, sendWin: 65535, maxOpen: 1<<31 - 1, streams: map[uint32]*leanCall{}}
	c.wcond.L = &c.wmu
	c.wbuf = append(c.wbuf, http2.ClientPreface...)
	c.wbuf = appendFrame(c.wbuf, http2.FrameSettings, 0, 0, []byte{0, byte(http2.SettingEnablePush), 0, 0, 0, 0})
	c.wbuf = appendWindowUpdate(c.wbuf, leanRecvWindow-65535)
	c.wmu.Lock()
	c.flushAndUnlock()
	go c.read()
	// The server's settings first: its limit on concurrent streams applies from
	// the first call.
	select {
	case <-c.settled:
		return c, nil
	case <-c.done:
		return nil, c.err
	case <-time.After(10 * time.Second):
		c.Close()
		return nil, fmt.Errorf("%s sent no HTTP/2 settings", addr)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func appendFrame(b []byte, typ http2.FrameType, flags http2.Flags, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), byte(typ), byte(flags))
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}

func appendWindowUpdate(b []byte, incr uint32) []byte {
	return appendFrame(b, http2.FrameWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, incr))
}

// Call sends msg (a gRPC message: flag byte, length and the encoded request) on a
// new stream and waits for the answer: the response message's bytes, valid until
// call is used again. Cancelling ctx abandons the stream.
func (c *leanConn) Call(ctx context.Context, call *leanCall, msg []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	call.data = call.data[:0]
	call.httpStatus, call.grpcStatus, call.grpcMsg = "", "", ""
	c.wmu.Lock()
	for c.err == nil && (c.sendWin < int64(len(msg)) || c.open >= c.maxOpen) {
		c.wcond.Wait()
	}
	if c.err == nil && c.nextID > 1<<31-1 {
		c.err = errors.New("stream ids exhausted")
	}
	if c.err != nil {
		err := c.err
		c.wmu.Unlock()
		return nil, err
	}
	id := c.nextID
	c.nextID += 2
	c.sendWin -= int64(len(msg))
	c.open++
	c.smu.Lock()
	c.streams[id] = call
	c.smu.Unlock()
	block := c.block
	if id == 1 {
		block = c.first
	}
	c.wbuf = appendFrame(c.wbuf, h2FrameHeaders, h2FlagHeaders, id, block)
	c.wbuf = appendFrame(c.wbuf, h2FrameData, h2FlagEnd, id, msg)
	c.flushAndUnlock()

	select {
	case err := <-call.done:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		c.smu.Lock()
		_, pending := c.streams[id]
		delete(c.streams, id)
		c.smu.Unlock()
		if !pending {
			<-call.done // finished meanwhile
			return nil, ctx.Err()
		}
		// The stream stays open on the server until it is reset (CANCEL).
		c.wmu.Lock()
		c.wbuf = appendFrame(c.wbuf, http2.FrameRSTStream, 0, id, binary.BigEndian.AppendUint32(nil, uint32(http2.ErrCodeCancel)))
		c.closedLocked()
		c.flushAndUnlock()
		return nil, ctx.Err()
	}
	switch {
	case call.httpStatus != "200":
		return nil, fmt.Errorf("HTTP status %q", call.httpStatus)
	case call.grpcStatus != "0":
		return nil, fmt.Errorf("gRPC status %s: %s", call.grpcStatus, call.grpcMsg)
	case len(call.data) < 5 || call.data[0] != 0 || int(binary.BigEndian.Uint32(call.data[1:5])) != len(call.data)-5:
		return nil, fmt.Errorf("not one uncompressed gRPC message: %x", call.data)
	}
	return call.data[5:], nil
}

// flushAndUnlock writes wbuf out unless another goroutine is doing so (which then
// writes what was queued too), and unlocks wmu. The caller holds wmu.
func (c *leanConn) flushAndUnlock() {
	if c.flushing {
		c.wmu.Unlock()
		return
	}
	c.flushing = true
	for len(c.wbuf) > 0 && c.err == nil {
		out := c.wbuf
		c.wbuf = c.spare[:0]
		c.wmu.Unlock()
		_, err := c.nc.Write(out)
		c.wmu.Lock()
		c.spare = out
		if err != nil {
			c.failLocked(fmt.Errorf("writing: %w", err))
		}
	}
	c.wbuf = c.wbuf[:0]
	c.flushing = false
	c.wmu.Unlock()
}

// closed counts a stream closed (wmu held).
func (c *leanConn) closedLocked() {
	c.open--
	c.wcond.Broadcast()
}

// closed counts n streams closed.
func (c *leanConn) closed(n int) {
	if n == 0 {
		return
	}
	c.wmu.Lock()
	c.open -= uint32(n)
	c.wcond.Broadcast()
	c.wmu.Unlock()
}

// queue writes a control frame.
func (c *leanConn) queue(typ http2.FrameType, flags http2.Flags, payload []byte) {
	c.wmu.Lock()
	c.wbuf = appendFrame(c.wbuf, typ, flags, 0, payload)
	c.flushAndUnlock()
}

func (c *leanConn) failLocked(err error) {
	if c.err == nil {
		c.err = err
		c.wcond.Broadcast()
		c.nc.Close()
	}
}

// fail makes the connection unusable and ends every call under way with err.
func (c *leanConn) fail(err error) {
	c.wmu.Lock()
	c.failLocked(err)
	err = c.err
	c.wmu.Unlock()
	c.smu.Lock()
	for id, call := range c.streams {
		call.done <- err
		delete(c.streams, id)
	}
	c.smu.Unlock()
}

// Close closes the connection; calls under way fail.
func (c *leanConn) Close() {
	c.fail(errors.New("connection closed"))
	<-c.done
}

// read reads the server's frames until the connection fails.
func (c *leanConn) read() {
	defer close(c.done)
	fr := http2.NewFramer(nil, bufio.NewReaderSize(c.nc, 32<<10))
	var cur *leanCall // the call whose header block is being decoded
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if cur == nil {
			return
		}
		switch f.Name {
		case ":status":
			cur.httpStatus = f.Value
		case "grpc-status":
			cur.grpcStatus = f.Value
		case "grpc-message":
			cur.grpcMsg = f.Value
		}
	})
	var (
		block    []byte // a header block and its CONTINUATIONs
		blockID  uint32
		blockEnd bool // the HEADERS frame ended its stream
		received uint32
		settled  bool
	)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			c.fail(fmt.Errorf("reading: %w", err))
			return
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			ended := 0
			c.smu.Lock()
			call := c.streams[f.StreamID]
			if call != nil {
				call.data = append(call.data, f.Data()...)
				if f.StreamEnded() {
					c.finishLocked(f.StreamID, call)
					ended = 1
				}
			}
			c.smu.Unlock()
			c.closed(ended)
			if received += f.Length; received >= leanRecvWindow/2 {
				c.queue(http2.FrameWindowUpdate, 0, binary.BigEndian.AppendUint32(nil, received))
				received = 0
			}
		case *http2.HeadersFrame:
			block, blockID, blockEnd = append(block[:0], f.HeaderBlockFragment()...), f.StreamID, f.StreamEnded()
			if f.HeadersEnded() {
				c.closed(c.headers(dec, &cur, blockID, block, blockEnd))
			}
		case *http2.ContinuationFrame:
			block = append(block, f.HeaderBlockFragment()...)
			if f.HeadersEnded() {
				c.closed(c.headers(dec, &cur, blockID, block, blockEnd))
			}
		case *http2.RSTStreamFrame:
			reset := 0
			c.smu.Lock()
			if call := c.streams[f.StreamID]; call != nil {
				delete(c.streams, f.StreamID)
				call.done <- fmt.Errorf("stream reset: %v", f.ErrCode)
				reset = 1
			}
			c.smu.Unlock()
			c.closed(reset)
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			// The later requests' header blocks rely on a dynamic table of
			// HPACK's default size.
			if v, ok := f.Value(http2.SettingHeaderTableSize); ok && v < 4096 {
				c.fail(fmt.Errorf("the server's HPACK table of %d bytes is smaller than 4096", v))
				return
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				c.wmu.Lock()
				c.maxOpen = v
				c.wcond.Broadcast()
				c.wmu.Unlock()
			}
			c.queue(http2.FrameSettings, h2FlagEnd, nil)
			if !settled {
				settled = true
				close(c.settled)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.queue(http2.FramePing, h2FlagEnd, f.Data[:])
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.wmu.Lock()
				c.sendWin += int64(f.Increment)
				c.wcond.Broadcast()
				c.wmu.Unlock()
			}
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("GOAWAY from the server: %v %q", f.ErrCode, f.DebugData()))
			return
		}
	}
}

// headers decodes a complete header block of stream id: the response's headers,
// its trailers, or both at once (trailers-only), which end the call. It returns
// how many calls it ended (0 or 1).
func (c *leanConn) headers(dec *hpack.Decoder, cur **leanCall, id uint32, block []byte, end bool) int {
	c.smu.Lock()
	defer c.smu.Unlock()
	*cur = c.streams[id] // nil for an abandoned stream, whose headers are decoded all the same
	defer func() { *cur = nil }()
	if _, err := dec.Write(block); err != nil {
		c.smu.Unlock()
		c.fail(fmt.Errorf("decoding headers: %w", err))
		c.smu.Lock()
		return 0
	}
	if *cur != nil && end {
		c.finishLocked(id, *cur)
		return 1
	}
	return 0
}

// finishLocked ends the call on stream id (smu held).
func (c *leanConn) finishLocked(id uint32, call *leanCall) {
	delete(c.streams, id)
	call.done <- nil
}
