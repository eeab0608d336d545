package queue

import (
	"encoding/hex"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// flowKeyLen is the length of a Message.FlowKey: 16 bytes of HMAC in hex.
const flowKeyLen = 32

// flowKeyFor returns the flow key of an order whose flow_by value is v in a queue of
// cfg ("" for a queue without flow_by). The value is hashed with the store's signing
// key, so that the stored key tells nothing of it and a client cannot aim its orders
// at another client's key without knowing its value.
func (s *Store) flowKeyFor(cfg queueconfig.Config, v string) string {
	if !cfg.FlowBy.Enabled() {
		return ""
	}
	return hex.EncodeToString(s.mac("sluice flow key", []byte(v))[:flowKeyLen/2])
}

// FlowKeyFor returns the flow key Park gives an order whose flow_by value is v in a
// queue of cfg: the admin API and tools name a key by its value with it.
func (s *Store) FlowKeyFor(cfg queueconfig.Config, v string) string {
	return s.flowKeyFor(cfg, v)
}

// ValidFlowKey reports whether k has the form of a flow key (Message.FlowKey).
func ValidFlowKey(k string) bool {
	if len(k) != flowKeyLen {
		return false
	}
	for i := range len(k) {
		if c := k[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
