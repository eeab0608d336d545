// Package headermap reuses a header map from one message to the next on a
// connection, where nothing reads the last message's map any more.
package headermap

import "net/http"

// MaxReused is the most fields a map may have held to be reused, cleared: a cleared
// map keeps its size, and writing or relaying a header iterates over all of it.
const MaxReused = 16

// Reset returns h cleared for the next message, or a new map when h is nil or held
// more than MaxReused fields. A new map per message costs two allocations.
func Reset(h http.Header) http.Header {
	if h == nil || len(h) > MaxReused {
		return make(http.Header, 8)
	}
	clear(h)
	return h
}
