package queue

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

func flowStatsOf(n int) []FlowStat {
	out := make([]FlowStat, n)
	for i := range out {
		out[i] = FlowStat{Key: fmt.Sprintf("%032x", i), Depth: i % 7, PerSecond: float64(i%50) / 10}
	}
	return out
}

// A report decodes to what was encoded; one too large for its bytes or past
// MaxFlowStats keeps the keys with the most orders and counts the others.
func TestFlowStatsRoundTrip(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_123)
	for _, tc := range []struct{ keys, maxBytes, kept int }{
		{0, maxFlowStatsBytes, 0},
		{3, maxFlowStatsBytes, 3},
		{10_000, maxFlowStatsBytes, 10_000},
		{MaxFlowStats + 5, maxFlowStatsBytes, MaxFlowStats},
		{1000, 2000, 0},
	} {
		in := flowStatsOf(tc.keys)
		b := encodeFlowStats(at, slices.Clone(in), tc.maxBytes)
		gotAt, got, truncated, err := decodeFlowStats(b)
		if err != nil || !gotAt.Equal(at) || truncated != tc.keys-len(got) {
			t.Fatalf("%d keys: %v %v truncated %d (kept %d)", tc.keys, err, gotAt, truncated, len(got))
		}
		if tc.kept > 0 && len(got) != tc.kept || len(b) > tc.maxBytes {
			t.Errorf("%d keys in %d bytes at most: kept %d in %d bytes, want %d", tc.keys, tc.maxBytes, len(got), len(b), tc.kept)
		}
		for i := 1; i < len(got); i++ {
			if got[i].Depth > got[i-1].Depth {
				t.Fatalf("a deeper key was left out before a shallower one: %+v then %+v", got[i-1], got[i])
			}
		}
		want := map[string]FlowStat{}
		for _, s := range in {
			want[s.Key] = s
		}
		for _, s := range got {
			if w := want[s.Key]; w.Depth != s.Depth || math.Abs(w.PerSecond-s.PerSecond) > 0.0005 {
				t.Fatalf("%s: got %+v, want %+v", s.Key, s, w)
			}
		}
		if tc.keys == 10_000 {
			t.Logf("10,000 keys: a report of %d bytes (%.1f a key)", len(b), float64(len(b))/10_000)
		}
	}
	for _, bad := range [][]byte{nil, []byte("sfs1"), []byte("xxxx00000000\x00\x00"),
		append(encodeFlowStats(at, flowStatsOf(2), maxFlowStatsBytes), 0),
		encodeFlowStats(at, flowStatsOf(2), maxFlowStatsBytes)[:30]} {
		if _, _, _, err := decodeFlowStats(bad); err == nil {
			t.Errorf("decodeFlowStats(%q) succeeded", bad)
		}
	}
}

// A report read from the bucket is hostile input: decoding never panics, and what
// decodes encodes again to the same bytes.
func FuzzDecodeFlowStats(f *testing.F) {
	f.Add(encodeFlowStats(time.UnixMilli(5), flowStatsOf(3), maxFlowStatsBytes))
	f.Add([]byte("sfs1\x00\x00\x00\x00\x00\x00\x00\x01\x00\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		at, stats, truncated, err := decodeFlowStats(b)
		if err != nil {
			return
		}
		for _, s := range stats {
			if !ValidFlowKey(s.Key) || s.Depth < 0 || s.PerSecond < 0 || math.IsNaN(s.PerSecond) {
				t.Fatalf("decoded %+v", s)
			}
		}
		_, again, tr2, err := decodeFlowStats(encodeFlowStats(at, slices.Clone(stats), maxFlowStatsBytes))
		if err != nil || len(again) != len(stats) || tr2 != 0 {
			t.Fatalf("re-encoded: %v, %d keys of %d (%d truncated, %d before)", err, len(again), len(stats), tr2, truncated)
		}
	})
}
