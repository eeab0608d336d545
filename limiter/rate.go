package limiter

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Rate is Count events per Period: a refill rate, a queue's outflow, a pace. It is
// written COUNT/PERIOD ("50/s", "3000/10m") in rules files and flags.
type Rate struct {
	Count  int64
	Period time.Duration
}

// PerSecond returns a Rate of n per second.
func PerSecond(n int64) Rate { return Rate{Count: n, Period: time.Second} }

// Valid reports whether both Count and Period are positive.
func (r Rate) Valid() bool { return r.Count > 0 && r.Period > 0 }

// IsZero reports whether the rate is unset.
func (r Rate) IsZero() bool { return r.Count == 0 && r.Period == 0 }

// Interval is the even spacing between two events at rate r, rounded down to the
// nanosecond; 0 for an invalid rate.
func (r Rate) Interval() time.Duration {
	if !r.Valid() {
		return 0
	}
	return r.Period / time.Duration(r.Count)
}

// PerSecondFloat returns r in events per second.
func (r Rate) PerSecondFloat() float64 {
	if !r.Valid() {
		return 0
	}
	return float64(r.Count) / r.Period.Seconds()
}

// String writes r as ParseRate reads it, the period in its largest whole unit:
// "50/s", "3000/10m", "1/1d".
func (r Rate) String() string {
	switch r.Period {
	case time.Second:
		return strconv.FormatInt(r.Count, 10) + "/s"
	case time.Minute:
		return strconv.FormatInt(r.Count, 10) + "/m"
	case time.Hour:
		return strconv.FormatInt(r.Count, 10) + "/h"
	}
	return strconv.FormatInt(r.Count, 10) + "/" + FormatDuration(r.Period)
}

// ParseRate reads COUNT/PERIOD. COUNT is a whole number of at least 1; PERIOD is a
// unit name — s, sec, second, m, min, minute, h, hour, d, day, and Envoy's week,
// month (30 days) and year (365 days), in any case — or a duration as ParseDuration
// reads it (500ms, 10s, 1h30m, 7d); a bare duration unit is one of it (5/ms).
func ParseRate(s string) (Rate, error) {
	count, unit, found := strings.Cut(strings.TrimSpace(s), "/")
	if !found {
		return Rate{}, fmt.Errorf("rate %q must look like 50/s, 100/minute or 3000/10m", s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
	if err != nil || n < 1 {
		return Rate{}, fmt.Errorf("rate %q: the count must be a whole number of at least 1", s)
	}
	unit = strings.TrimSpace(unit)
	d, known := UnitPeriod(unit)
	if !known {
		text := unit
		if c := unit[0:min(len(unit), 1)]; c != "" && (c[0] >= 'a' && c[0] <= 'z' || c[0] >= 0x80) {
			text = "1" + unit // ms, us, µs
		}
		if d, err = ParseDuration(text); err != nil || d <= 0 {
			return Rate{}, fmt.Errorf("rate %q: unknown unit %q (use s, m, h, d, their names, or a duration like 10m)", s, unit)
		}
	}
	return Rate{Count: n, Period: d}, nil
}

// units are the named periods of ParseRate and UnitPeriod, shortest first: each
// unit's name (Envoy's unit, in lower case), then its other spellings.
var units = [...]struct {
	period time.Duration
	names  []string
}{
	{time.Second, []string{"second", "s", "sec"}},
	{time.Minute, []string{"minute", "m", "min"}},
	{time.Hour, []string{"hour", "h"}},
	{24 * time.Hour, []string{"day", "d"}},
	{7 * 24 * time.Hour, []string{"week"}},
	{30 * 24 * time.Hour, []string{"month"}},
	{365 * 24 * time.Hour, []string{"year"}},
}

// UnitPeriod maps a unit name of ParseRate, in any case, to its period.
func UnitPeriod(unit string) (time.Duration, bool) {
	unit = strings.ToLower(unit)
	for _, u := range units {
		if slices.Contains(u.names, unit) {
			return u.period, true
		}
	}
	return 0, false
}

// UnitNames returns the name of each unit UnitPeriod knows, shortest first (second,
// minute, hour, day, week, month, year), without their other spellings.
func UnitNames() []string {
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.names[0]
	}
	return names
}

// ParseDuration is time.ParseDuration with whole days in front: "7d", "1d12h", "30s".
func ParseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("empty duration (write it like 30s, 10m, 1h or 1d)")
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 32)
		if err != nil || n < 0 || n > 36500 {
			return 0, fmt.Errorf("invalid duration %q (write it like 30s, 10m, 1h or 1d)", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return 0, fmt.Errorf("duration %q needs a unit (write it like 30s, 10m, 1h or 1d)", s)
		}
		return 0, fmt.Errorf("invalid duration %q (write it like 30s, 10m, 1h or 1d)", s)
	}
	if d > time.Duration(math.MaxInt64)-days {
		return 0, fmt.Errorf("duration %q is too long", s)
	}
	return days + d, nil
}

// FormatDuration writes d compactly in its largest whole unit, as ParseDuration reads
// it: 1s, 10m, 1d, 250ms, 3us.
func FormatDuration(d time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}}
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(d), 10) + "ns"
}
