package queue

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NewTicket lets the external tests make tickets as Park does.
var NewTicket = newTicket

// Conn, JetStream and Stream let the external tests look at and change the server state
// the store keeps to itself.
func (s *Store) Conn() *nats.Conn               { return s.nc }
func (s *Store) JetStream() jetstream.JetStream { return s.js }
func (q *Queue) Stream() jetstream.Stream       { return q.stream }
