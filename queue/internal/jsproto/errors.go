package jsproto

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes nats.go does not name (nats-server's errors.json).
const (
	errCodeStoreFailed    jetstream.ErrorCode = 10077 // JSStreamStoreFailedF: "maximum messages exceeded", …
	errCodeNoResources    jetstream.ErrorCode = 10023 // JSInsufficientResourcesErr: the server's store is full
	errCodeNoMemory       jetstream.ErrorCode = 10028 // JSMemoryResourcesExceededErr: "insufficient memory resources available"
	errCodeNoPeers        jetstream.ErrorCode = 10005 // JSClusterNoPeersErrF: "no suitable peers for placement, …"
	errCodeHeaderTooLarge jetstream.ErrorCode = 10097 // JSStreamHeaderExceedsMaximumErr: "header size exceeds maximum allowed of 64k"
)

// The classifications below read err's *jetstream.APIError, by its code where the
// code says enough (errors.Is with the jetstream package's error of that code, where
// it has one: an APIError matches another of its code), by its description where one
// code covers several refusals. This is the one place that reads descriptions; where
// nats.go names the error, callers test it with errors.Is (jetstream.ErrStreamNotFound,
// jetstream.ErrConsumerNotFound, jetstream.ErrMsgNotFound).

// Description returns the server's description of err, or "" when err carries no
// *jetstream.APIError.
func Description(err error) string {
	if e := apiError(err); e != nil {
		return e.Description
	}
	return ""
}

// IsFull reports whether a publish was refused by a discard-new stream at its
// MaxMsgs, MaxBytes or MaxMsgsPerSubject ("maximum messages exceeded", "maximum
// bytes exceeded", "maximum messages per subject exceeded"), not by another store
// failure of the same code (a message over the stream's maximum size among them).
func IsFull(err error) bool {
	e := apiError(err)
	if e == nil || e.ErrorCode != errCodeStoreFailed {
		return false
	}
	d := e.Description
	return strings.Contains(d, "maximum") && strings.Contains(d, "exceeded") && !strings.Contains(d, "size")
}

// IsPerSubjectLimit reports whether a publish was refused by a stream's
// MaxMsgsPerSubject with discard-new per subject.
func IsPerSubjectLimit(err error) bool {
	e := apiError(err)
	return e != nil && strings.Contains(e.Description, "per subject")
}

// IsNoResources reports whether the server refused a write for want of storage
// ("insufficient resources").
func IsNoResources(err error) bool {
	e := apiError(err)
	return e != nil && e.ErrorCode == errCodeNoResources
}

// IsNoMemory reports whether the server refused a memory stream for want of memory:
// a single server's "insufficient memory resources available" or "insufficient
// resources", a cluster's "no suitable peers for placement" for "insufficient
// storage". Not a placement that fails for peers offline, which passes.
func IsNoMemory(err error) bool {
	e := apiError(err)
	if e == nil {
		return false
	}
	switch e.ErrorCode {
	case errCodeNoMemory, errCodeNoResources:
		return true
	case errCodeNoPeers:
		return strings.Contains(e.Description, "insufficient storage")
	}
	return false
}

// IsHeaderTooLarge reports whether a message's headers were over what the server
// stores.
func IsHeaderTooLarge(err error) bool {
	e := apiError(err)
	return e != nil && e.ErrorCode == errCodeHeaderTooLarge
}

// IsMsgTooLarge reports whether a message was over the stream's or the server's
// maximum message size.
func IsMsgTooLarge(err error) bool {
	e := apiError(err)
	return errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) || e != nil && strings.Contains(e.Description, "message size exceeds")
}

// IsWrongLastSequence reports whether a publish expecting a subject's last sequence
// (a compare-and-set) found another one; a replicated stream answers with a code of
// its own.
func IsWrongLastSequence(err error) bool {
	e := apiError(err)
	return e != nil && (e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func apiError(err error) *jetstream.APIError {
	var e *jetstream.APIError
	if errors.As(err, &e) {
		return e
	}
	return nil
}
