package queue

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/nats-io/nats.go"
)

// The nats-server versions sluice needs, read from the server's own stream-level
// feature gates (nats-server server/jetstream_versioning.go: API level 1 is 2.11,
// level 2 is 2.12) and checked at Open and Declare against the version of the server
// the connection is on (nats.Conn.ConnectedServerVersion):
//
//	feature                                              minimum   without it
//	queues at all: per-message TTLs (dead letters, key   2.11.0    Open fails with
//	  slots, ticket records), key-value limit markers,             ErrServerVersion
//	  pinned priority groups (fail-over between
//	  dispatchers), consumer pause (Retry-After)
//	scheduled delivery (max_delay, delay: message        2.12.0    Declare refuses the
//	  schedules, ADR-51)                                           queue
//	atomic batch publish (Park's group commit)           2.12.0    plain publishes, one
//	                                                               acknowledgement each
//	async persist mode (single-replica key slots)        2.12.0    synced key slots
//
// On a cluster the version is that of the node the connection is on; nodes of one
// cluster should run one version (during a rolling upgrade, upgrade every node
// before sluice uses a feature of the new one).
const (
	// MinServerVersion is the oldest nats-server that holds sluice's queues.
	MinServerVersion = "2.11.0"
	// MinScheduleServerVersion is the oldest nats-server with message schedules, which
	// a queue with delay or max_delay needs.
	MinScheduleServerVersion = "2.12.0"
	// minBatchServerVersion is the oldest nats-server with atomic batch publish and
	// the async persist mode; sluice does without them on older ones.
	minBatchServerVersion = "2.12.0"
)

// ErrServerVersion: the NATS server is older than sluice, or a feature of a queue,
// needs. The error is a *ServerVersionError. Open wraps it together with
// ErrUnavailable (another server, or this one upgraded, may do); Declare together
// with ErrInvalidConfig (the queue's configuration asks for what the server lacks).
var ErrServerVersion = errors.New("queue: nats-server too old")

// ServerVersionError says which server version was found, which one a feature needs,
// and the feature.
type ServerVersionError struct {
	Found   string // as the server reports it, for example "2.9.10"
	Needed  string // for example "2.11.0"
	Feature string // for example "scheduled delivery (delay, max_delay)"
}

func (e *ServerVersionError) Error() string {
	return fmt.Sprintf("nats-server %s is too old for %s: it needs nats-server %s or later", e.Found, e.Feature, e.Needed)
}

// Is makes errors.Is(err, ErrServerVersion) hold.
func (e *ServerVersionError) Is(target error) bool { return target == ErrServerVersion }

var versionRE = regexp.MustCompile(`^v?(\d{1,9})\.(\d{1,9})\.(\d{1,9})`)

// parseVersion reads major, minor and patch from a version such as "2.12.1" or
// "v2.11.0-RC.1" (a pre-release counts as its release); ok is false when the text is
// none.
func parseVersion(v string) (ver [3]int, ok bool) {
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return ver, false
	}
	for i := range ver {
		ver[i], _ = strconv.Atoi(m[i+1])
	}
	return ver, true
}

// versionAtLeast reports whether version have is min or later. A version that does
// not parse is taken as too old: a server that does not say what it is cannot be
// relied on for anything.
func versionAtLeast(have, min string) bool {
	h, ok := parseVersion(have)
	m, _ := parseVersion(min)
	if !ok {
		return false
	}
	for i := range h {
		if h[i] != m[i] {
			return h[i] > m[i]
		}
	}
	return true
}

// checkServerVersion returns a *ServerVersionError when the server nc is connected to
// is older than min, which feature needs; nil when it is not, or when nc is not
// connected (whatever is asked of the server then fails on its own).
func checkServerVersion(nc *nats.Conn, min, feature string) error {
	have := nc.ConnectedServerVersion()
	if have == "" || versionAtLeast(have, min) {
		return nil
	}
	return &ServerVersionError{Found: have, Needed: min, Feature: feature}
}
