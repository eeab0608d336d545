package ingress

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"time"
)

// The RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11:
// each a Structured Field list (RFC 8941) of items whose value is the policy name as an
// sf-string, with parameters
//
//	RateLimit-Policy: "name";q=QUOTA;w=WINDOW_SECONDS[;pk=:BASE64:]
//	RateLimit:        "name";r=REMAINING;t=SECONDS_UNTIL_RESET[;pk=:BASE64:]

// Policy is one quota policy as the RateLimit-Policy field advertises it.
type Policy struct {
	Name         string
	Quota        int64
	Window       time.Duration // rounded up to whole seconds; 0 leaves w out
	PartitionKey []byte        // optional; never a raw client identifier
}

// Status is the state of one policy for the current request, for the RateLimit field.
type Status struct {
	Name         string
	Remaining    int64
	Reset        time.Duration // rounded up to whole seconds
	PartitionKey []byte
}

// maxSFInteger is the largest integer RFC 8941 can carry (15 digits).
const maxSFInteger = 999_999_999_999_999

// FormatPolicy serialises RateLimit-Policy. It fails only for a name that is not a
// valid sf-string (printable ASCII).
func FormatPolicy(policies ...Policy) (string, error) {
	var buf [96]byte // one policy fits: the field costs one allocation
	b := buf[:0]
	for i, p := range policies {
		var err error
		if b, err = appendPolicy(b, i, p); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

// FormatRateLimit serialises RateLimit.
func FormatRateLimit(statuses ...Status) (string, error) {
	var buf [96]byte
	b := buf[:0]
	for i, s := range statuses {
		var err error
		if b, err = appendStatus(b, i, s); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

// appendPolicy appends p, the list's item i, to b.
func appendPolicy(b []byte, i int, p Policy) ([]byte, error) {
	b, err := appendItem(b, i, p.Name)
	if err != nil {
		return nil, err
	}
	b = appendInt(b, "q", p.Quota)
	if p.Window > 0 {
		b = appendInt(b, "w", RetryAfterSeconds(p.Window))
	}
	return appendBytes(b, "pk", p.PartitionKey), nil
}

// appendStatus appends s, the list's item i, to b.
func appendStatus(b []byte, i int, s Status) ([]byte, error) {
	b, err := appendItem(b, i, s.Name)
	if err != nil {
		return nil, err
	}
	b = appendInt(b, "r", s.Remaining)
	b = appendInt(b, "t", RetryAfterSeconds(s.Reset))
	return appendBytes(b, "pk", s.PartitionKey), nil
}

// RetryAfterSeconds rounds d up to whole seconds, as Retry-After and the draft's
// parameters count them (0 for d ≤ 0). It never overflows: rounding up divides first,
// so the longest Duration gives its whole seconds plus one, never a negative number.
func RetryAfterSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	secs := int64(d / time.Second)
	if d%time.Second != 0 {
		secs++
	}
	return secs
}

func appendItem(b []byte, i int, name string) ([]byte, error) {
	if i > 0 {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	for j := 0; j < len(name); j++ {
		c := name[j]
		if c < 0x20 || c > 0x7e {
			return nil, fmt.Errorf("ratelimit header: policy name %q: byte %#x is not allowed in a structured-field string", name, c)
		}
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"'), nil
}

func appendInt(b []byte, key string, v int64) []byte {
	v = min(max(v, -maxSFInteger), maxSFInteger)
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, '=')
	return strconv.AppendInt(b, v, 10)
}

func appendBytes(b []byte, key string, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, "=:"...)
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, ':')
}
