package pace

import (
	"context"
	"errors"
	"math/bits"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// simClock is a simulated clock: Sleep advances it by the duration plus a simulated
// wake-up lateness; nothing really sleeps.
type simClock struct {
	mu   sync.Mutex
	now  time.Time
	late func() time.Duration
}

func newSimClock() *simClock {
	return &simClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *simClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
	if c.late != nil {
		c.now = c.now.Add(c.late())
	}
	return ctx.Err()
}

func (c *simClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// ceilRate returns ceil(rate × dt) exactly.
func ceilRate(r limiter.Rate, dt time.Duration) uint64 {
	hi, lo := bits.Mul64(uint64(r.Count), uint64(dt))
	q, rem := bits.Div64(hi, lo, uint64(r.Period))
	if rem != 0 {
		q++
	}
	return q
}

// checkBound verifies that every window [t_i, t_j] holds at most ceil(rate × Δt) + 1
// starts, with Δt at least minWindow, and that the times strictly increase.
func checkBound(t *testing.T, r limiter.Rate, times []time.Time, minWindow time.Duration) {
	t.Helper()
	for i := 1; i < len(times); i++ {
		if !times[i].After(times[i-1]) {
			t.Fatalf("start %d (%v) not after start %d (%v)", i, times[i], i-1, times[i-1])
		}
	}
	worst := 0
	for i := range times {
		for j := i + 1; j < len(times); j++ {
			dt := max(times[j].Sub(times[i]), minWindow)
			allowed := ceilRate(r, dt) + 1
			if n := uint64(j - i + 1); n > allowed {
				t.Fatalf("rate %s: %d starts within %v (%v .. %v), bound %d", r, n, dt, times[i], times[j], allowed)
			}
			if dt > 50*r.Interval()+minWindow {
				break
			}
		}
	}
	_ = worst
}

func TestPacerBoundUnderLatenessAndStalls(t *testing.T) {
	rates := []limiter.Rate{
		limiter.PerSecond(10), limiter.PerSecond(1000), limiter.PerSecond(7919),
		{Count: 3, Period: 7 * time.Second}, {Count: 1, Period: time.Minute},
	}
	for _, r := range rates {
		t.Run(r.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(r.Count)))
			clk := newSimClock()
			iv := r.Interval()
			clk.late = func() time.Duration {
				switch x := rng.IntN(100); {
				case x < 70:
					return time.Duration(rng.Int64N(int64(iv)/10 + 1)) // on time-ish
				case x < 95:
					return time.Duration(rng.Int64N(int64(iv) + 1)) // up to one interval late
				default:
					return time.Duration(rng.Int64N(int64(5*iv) + 1)) // a stall
				}
			}
			p := mustNew(t, r, WithClock(clk))
			ctx := context.Background()
			var times []time.Time
			for i := range 3000 {
				if rng.IntN(50) == 0 { // idle gaps and long stalls between callers
					clk.Advance(time.Duration(rng.Int64N(int64(20 * iv))))
				}
				if i == 1500 {
					p.PauseUntil(clk.Now().Add(3 * iv))
				}
				g, err := p.Grant(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !g.Equal(clk.Now()) {
					t.Fatalf("grant %v is not the clock's time %v", g, clk.Now())
				}
				times = append(times, g)
			}
			checkBound(t, r, times, 0)
		})
	}
}

func TestPacerExactRateWhenOnTime(t *testing.T) {
	for _, r := range []limiter.Rate{limiter.PerSecond(1000), {Count: 3, Period: time.Second}, limiter.PerSecond(10)} {
		clk := newSimClock()
		lateRng := rand.New(rand.NewPCG(7, 7))
		// Lateness below the tolerance loses no slot.
		tol := min(r.Interval()/2, DefaultTolerance)
		clk.late = func() time.Duration { return time.Duration(lateRng.Int64N(int64(tol))) }
		p := mustNew(t, r, WithClock(clk))
		first, _ := p.Grant(context.Background())
		var last time.Time
		n := int(r.Count) * 10
		for range n {
			last, _ = p.Grant(context.Background())
		}
		// n intervals after the first start, give or take the last one's lateness.
		want := time.Duration(int64(n) * int64(r.Period) / r.Count)
		if got := last.Sub(first); got < want || got > want+tol {
			t.Errorf("rate %s: %d starts took %v, want %v", r, n, got, want)
		}
	}
}

func TestPacerNoCatchUpAfterStall(t *testing.T) {
	r := limiter.PerSecond(10)
	clk := newSimClock()
	p := mustNew(t, r, WithClock(clk))
	ctx := context.Background()
	var times []time.Time
	for range 5 {
		g, _ := p.Grant(ctx)
		times = append(times, g)
	}
	clk.Advance(10 * time.Second) // nobody called for 10s: 100 slots unused
	stallEnd := clk.Now()
	for range 20 {
		g, _ := p.Grant(ctx)
		times = append(times, g)
	}
	if !times[5].Equal(stallEnd) {
		t.Errorf("first start after the stall at %v, want at once (%v)", times[5], stallEnd)
	}
	// One second after the stall: at most ceil(10 × 1) + 1 starts, not a burst.
	n := 0
	for _, g := range times[5:] {
		if g.Sub(stallEnd) <= time.Second {
			n++
		}
	}
	if n > 11 {
		t.Errorf("%d starts in the second after the stall", n)
	}
	checkBound(t, r, times, 0)
}

func TestPacerPauseAndRateChange(t *testing.T) {
	clk := newSimClock()
	p := mustNew(t, limiter.PerSecond(100), WithClock(clk))
	ctx := context.Background()
	g0, _ := p.Grant(ctx)
	until := g0.Add(2 * time.Second)
	p.PauseUntil(until)
	p.PauseUntil(g0.Add(time.Second)) // shorter: ignored
	if got := p.PausedUntil(); !got.Equal(until) {
		t.Fatalf("paused until %v", got)
	}
	if next := p.Next(); !next.Equal(until) {
		t.Errorf("next %v, want %v", next, until)
	}
	g1, _ := p.Grant(ctx)
	if g1.Before(until) {
		t.Errorf("start %v during the pause (until %v)", g1, until)
	}
	if err := p.SetRate(limiter.PerSecond(2)); err != nil {
		t.Fatal(err)
	}
	if p.Rate() != limiter.PerSecond(2) {
		t.Errorf("rate %v", p.Rate())
	}
	g2, _ := p.Grant(ctx)
	if g2.Sub(g1) < 500*time.Millisecond {
		t.Errorf("after slowing to 2/s the next start came %v later", g2.Sub(g1))
	}
}

func TestPacerCancelUsesNoSlot(t *testing.T) {
	clk := newSimClock()
	p := mustNew(t, limiter.PerSecond(1), WithClock(clk))
	g0, _ := p.Grant(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Grant(ctx); err == nil {
		t.Fatal("cancelled wait succeeded")
	}
	g1, _ := p.Grant(context.Background())
	if g1.Sub(g0) != time.Second {
		t.Errorf("second start %v after the first, want 1s", g1.Sub(g0))
	}
}

func TestPacerConcurrentWaiters(t *testing.T) {
	r := limiter.PerSecond(500)
	clk := newSimClock()
	rng := rand.New(rand.NewPCG(3, 4))
	var rmu sync.Mutex
	clk.late = func() time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return time.Duration(rng.Int64N(int64(3 * time.Millisecond)))
	}
	p := mustNew(t, r, WithClock(clk))
	var mu sync.Mutex
	var times []time.Time
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				g, err := p.Grant(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				times = append(times, g)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	if len(times) != 800 {
		t.Fatalf("%d starts", len(times))
	}
	checkBound(t, r, times, 0)
}

// Real time: only the bound is asserted (it holds on the returned times by
// construction, however loaded the machine), never the speed.
func TestPacerRealClockBound(t *testing.T) {
	for _, r := range []limiter.Rate{limiter.PerSecond(200), limiter.PerSecond(2000)} {
		p := mustNew(t, r)
		var times []time.Time
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			g, err := p.Grant(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			times = append(times, g)
		}
		checkBound(t, r, times, 0)
	}
}

func TestSystemClockSleepCancels(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	start := time.Now()
	if err := (SystemClock{}).Sleep(ctx, time.Minute); err == nil {
		t.Fatal("sleep not cancelled")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("cancel took too long")
	}
	start = time.Now()
	_ = SystemClock{}.Sleep(context.Background(), 3*time.Millisecond)
	if time.Since(start) < 3*time.Millisecond {
		t.Error("slept less than asked")
	}
}

func mustNew(t *testing.T, r limiter.Rate, opts ...Option) *Pacer {
	t.Helper()
	p, err := New(r, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, f := range map[string]func() error{
		"zero rate":          func() error { _, err := New(limiter.Rate{}); return err },
		"negative count":     func() error { _, err := New(limiter.Rate{Count: -1, Period: time.Second}); return err },
		"nil clock":          func() error { _, err := New(limiter.PerSecond(1), WithClock(nil)); return err },
		"negative tolerance": func() error { _, err := New(limiter.PerSecond(1), WithTolerance(-1)); return err },
		"SetRate zero": func() error {
			p := mustNew(t, limiter.PerSecond(1))
			err := p.SetRate(limiter.Rate{Period: time.Second})
			if p.Rate() != limiter.PerSecond(1) {
				t.Errorf("a refused SetRate changed the rate to %v", p.Rate())
			}
			return err
		},
		"transport zero rate": func() error { _, err := NewTransport(nil, limiter.Rate{}); return err },
		"transport retries":   func() error { _, err := NewTransport(nil, limiter.PerSecond(1), WithRetryLimit(-1)); return err },
		"transport pause": func() error {
			_, err := NewTransport(nil, limiter.PerSecond(1), WithTransportPause(0, time.Hour))
			return err
		},
		"transport default>max": func() error {
			_, err := NewTransport(nil, limiter.PerSecond(1), WithTransportPause(time.Hour, time.Second))
			return err
		},
		"transport clock":  func() error { _, err := NewTransport(nil, limiter.PerSecond(1), WithTransportClock(nil)); return err },
		"transport shared": func() error { _, err := NewTransport(nil, limiter.PerSecond(1), WithShared(nil)); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

func TestPacerWaitLikeXTimeRate(t *testing.T) {
	clk := newSimClock()
	p := mustNew(t, limiter.PerSecond(4), WithClock(clk))
	start := clk.Now()
	for range 5 {
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := clk.Now().Sub(start); got != time.Second {
		t.Errorf("5 waits at 4/s took %v, want 1s", got)
	}
}

// gaps returns the spacing of consecutive grants.
func gaps(times []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(times); i++ {
		out = append(out, times[i].Sub(times[i-1]))
	}
	return out
}

func TestPacerSpread(t *testing.T) {
	ctx := context.Background()
	clk := newSimClock()
	p := mustNew(t, limiter.PerSecond(100), WithClock(clk))
	grant := func(n int) []time.Time {
		var ts []time.Time
		for range n {
			g, err := p.Grant(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ts = append(ts, g)
		}
		return ts
	}
	first := grant(1)[0]
	// 4 left for the next 2s: 100/s would spend them in 40ms; one every 500ms instead.
	p.Spread(4, first.Add(2*time.Second))
	if p.Rate() != limiter.PerSecond(100) {
		t.Errorf("Rate %v: a spread changed the set rate", p.Rate())
	}
	ts := grant(4)
	for i, g := range gaps(append([]time.Time{first}, ts...)) {
		if g != 500*time.Millisecond {
			t.Errorf("gap %d during the spread: %v, want 500ms", i, g)
		}
	}
	// The fourth start is at the reset; the set rate is back from there. The grid
	// restarts there as after a stall (at now − τ, τ = 2ms), so the first gap may be
	// short by τ, never more.
	if !ts[3].Equal(first.Add(2 * time.Second)) {
		t.Errorf("fourth spread start at %v, want the reset", ts[3].Sub(first))
	}
	for i, g := range gaps(append(ts[3:], grant(3)...)) {
		if g != 10*time.Millisecond && (i > 0 || g < 8*time.Millisecond || g > 10*time.Millisecond) {
			t.Errorf("gap %d after the spread: %v, want 10ms", i, g)
		}
	}

	// A sleeper on a long spread interval wakes when the spread ends.
	last := clk.Now()
	p.Spread(1, last.Add(300*time.Millisecond)) // one every 300ms until +300ms
	g := grant(1)[0]
	if g.Sub(last) != 300*time.Millisecond {
		t.Errorf("start %v after the last, want 300ms", g.Sub(last))
	}

	// Plenty remaining: no slowdown, and it replaces a slower spread.
	last = clk.Now()
	p.Spread(2, last.Add(10*time.Second))
	p.Spread(1000, last.Add(10*time.Second))
	if g := grant(1)[0]; g.Sub(last) < 8*time.Millisecond || g.Sub(last) > 10*time.Millisecond {
		t.Errorf("after a generous quota the next start came %v later, want 10ms (less τ)", g.Sub(last))
	}

	// Nothing remaining: a pause until the reset, never shortened by a later report.
	last = clk.Now()
	p.Spread(0, last.Add(3*time.Second))
	p.Spread(0, last.Add(time.Second))
	if !p.PausedUntil().Equal(last.Add(3 * time.Second)) {
		t.Errorf("paused until %v", p.PausedUntil())
	}
	if g := grant(1)[0]; !g.Equal(last.Add(3 * time.Second)) {
		t.Errorf("start %v after nothing remained, want at the reset (3s)", g.Sub(last))
	}

	// A reset that has passed clears the spread.
	p.Spread(1, clk.Now().Add(time.Hour))
	p.Spread(1, clk.Now())
	last = clk.Now()
	if g := grant(1)[0]; g.Sub(last) != 10*time.Millisecond {
		t.Errorf("after a past reset the next start came %v later, want 10ms", g.Sub(last))
	}
}

// The bound at the set rate holds across spreads that begin and end at random, under
// random lateness and stalls.
func TestPacerBoundAcrossSpreads(t *testing.T) {
	for _, r := range []limiter.Rate{limiter.PerSecond(50), limiter.PerSecond(1000)} {
		rng := rand.New(rand.NewPCG(11, uint64(r.Count)))
		clk := newSimClock()
		iv := r.Interval()
		clk.late = func() time.Duration { return time.Duration(rng.Int64N(int64(iv) + 1)) }
		p := mustNew(t, r, WithClock(clk))
		var times []time.Time
		for range 4000 {
			switch rng.IntN(40) {
			case 0:
				p.Spread(rng.Int64N(20)+1, clk.Now().Add(time.Duration(rng.Int64N(int64(30*iv)))))
			case 1:
				clk.Advance(time.Duration(rng.Int64N(int64(10 * iv))))
			}
			g, err := p.Grant(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			times = append(times, g)
		}
		checkBound(t, r, times, 0)
	}
}
