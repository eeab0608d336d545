package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/cmd/internal/progress"
	"github.com/sluicehq/sluice/limiter"
)

const limiterHelp = `Usage: sluice-bench limiter [flags]

Measures decisions per second, in one process and one run:
  memory, 1 key       the memory store vs one golang.org/x/time/rate Limiter (Allow)
  memory, 100k keys   the memory store vs x/time/rate Limiters in a mutex-guarded map
                      (the usual per-key pattern), each with 1 and GOMAXPROCS callers
  redis, N keys       the Redis store vs github.com/go-redis/redis_rate/v10 on the same
                      Redis, with 1, 16 and 64 callers, each on its own keys; the store
                      waits for Redis up to 3s, as redis_rate does, not its 50ms default
                      (a decision that falls back to memory all the same is warned about,
                      and its scenario's GOAL line says "not shown")
With --rounds N, each scenario measures the peer and sluice in turn N times (peer,
sluice, peer, sluice…) and reports the round whose ratio is the median, with the
lowest and highest ratio of all rounds: on a machine shared with other work, one
pair of measurements says little. --memory=false runs the Redis scenarios alone.
Every algorithm is a token bucket (x/time/rate's; redis_rate's GCRA is its equivalent)
of 10^12 tokens refilled at 1/s: every request is allowed and every key's state stays
live, so the figures are the cost of the decision path. Keys are drawn at random in the
memory scenarios, each written into a buffer of its caller's as the ingress writes the
key of a request it has just read (shaped like its keys, 53 bytes), and round-robin per
caller in the Redis ones. Each measurement runs
after a warm-up of its own; the peer runs first.

NS/DECISION is wall time per decision (1s / decisions per second); LATENCY is the mean
time one caller waits for a decision (callers / decisions per second); VS PEER is
sluice's decisions per second divided by the peer's in the same scenario. CPU NS is the
process's CPU time (user and system) per decision, and VS PEER (CPU) the peer's CPU time
per decision divided by sluice's: on a machine whose cores other processes share, wall
time measures the scheduler as much as the code, and CPU time is the steadier figure.
The GOAL lines check the stores' targets against both ratios.

Flags:
`

// benchRate and benchBurst make every contender allow every request: a bucket of 10^12
// is not emptied by any run. The slow refill keeps every key's state live between two
// visits; a key whose state is back to fresh may be dropped by a store (the memory
// store does, to stay bounded) and created again, which would measure key creation
// instead of decisions. One request's token takes a second to refill: with 100k keys
// drawn at random, a key waits a second for its next visit only in a run slower than
// 100k decisions a second, or once in 400 visits at 600k a second (a loaded machine).
// At 10/s, a tenth of a second, a third of the decisions of such a run created keys.
const (
	benchRate  = 1 // per second
	benchBurst = 1_000_000_000_000
)

var benchLimit = limiter.Limit{Algorithm: limiter.TokenBucket, Rate: benchRate, Period: time.Second, Burst: benchBurst}

type limiterConfig struct {
	duration, warmup time.Duration
	rounds           int
	memory           bool
	keys             int
	redisURL         string
	redisKeys        int
	redisCallers     []int
}

func runLimiter(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("limiter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg limiterConfig
	fs.DurationVar(&cfg.duration, "duration", 2*time.Second, "how long each measurement runs")
	fs.DurationVar(&cfg.warmup, "warmup", 0, "warm-up before each measurement (default a quarter of --duration, at most 1s)")
	fs.IntVar(&cfg.rounds, "rounds", 1, "measurements of each contender per scenario, alternating; the median round is reported")
	fs.BoolVar(&cfg.memory, "memory", true, "run the memory scenarios")
	fs.IntVar(&cfg.keys, "keys", 100_000, "distinct keys of the many-keys memory scenario")
	fs.StringVar(&cfg.redisURL, "redis", "redis://127.0.0.1:6379/0", "Redis `URL` for the Redis scenarios; '' skips them")
	fs.IntVar(&cfg.redisKeys, "redis-keys", 1000, "keys per caller in the Redis scenarios, used round-robin")
	callers := fs.String("redis-callers", "1,16,64", "comma-separated caller counts of the Redis scenarios")
	out := addOutputFlags(fs, true)
	if code, done := parseModeFlags(fs, args, limiterHelp, stdout); done {
		return code
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["warmup"] {
		cfg.warmup = min(cfg.duration/4, time.Second)
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "sluice-bench limiter: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	case cfg.duration <= 0 || cfg.warmup < 0:
		fmt.Fprintln(stderr, "sluice-bench limiter: --duration must be positive and --warmup not negative")
		return exitUsage
	case cfg.keys < 1 || cfg.redisKeys < 1 || cfg.rounds < 1:
		fmt.Fprintln(stderr, "sluice-bench limiter: --keys, --redis-keys and --rounds must be positive")
		return exitUsage
	}
	for _, f := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "sluice-bench limiter: --redis-callers: %q is not a positive number\n", f)
			return exitUsage
		}
		cfg.redisCallers = append(cfg.redisCallers, n)
	}

	var scenarios []scenario
	if cfg.memory {
		scenarios = memoryScenarios(cfg)
	}
	if cfg.redisURL != "" {
		rs, cleanup, err := redisScenarios(ctx, cfg)
		if err != nil {
			fmt.Fprintf(stderr, "sluice-bench limiter: --redis %s: %v (pass --redis '' to skip the Redis scenarios)\n", cfg.redisURL, err)
			return exitFailure
		}
		defer func() {
			if err := cleanup(); err != nil {
				fmt.Fprintf(stderr, "sluice-bench limiter: removing the benchmark's Redis keys: %v\n", err)
			}
		}()
		scenarios = append(scenarios, rs...)
	}

	results, err := runScenarios(ctx, cfg, scenarios, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench limiter: %v\n", err)
		return exitFailure
	}
	if out.svg != "" {
		if err := writeSVGFile(out.svg, limiterChart(cfg, results)); err != nil {
			fmt.Fprintf(stderr, "sluice-bench limiter: --svg: %v\n", err)
			return exitFailure
		}
	}
	if out.json {
		err = writeJSON(stdout, cfg, results)
	} else {
		err = writeTable(stdout, results)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench limiter: writing the results: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// limiterChart draws decisions per second, a group per scenario and caller count,
// sluice's ratio over the peer's and the peer's own 1.
func limiterChart(cfg limiterConfig, results []result) barChart {
	c := barChart{
		Title: "sluice-bench limiter: decisions per second",
		Subtitle: fmt.Sprintf("%s each after a %s warm-up; %s keys (memory), %s keys per caller (Redis); GOMAXPROCS %d; %s",
			cfg.duration, cfg.warmup, count(cfg.keys), count(cfg.redisKeys), runtime.GOMAXPROCS(0), runtime.Version()),
		Unit: "decisions/s",
		Note: "ratio: decisions per second over the peer's in the same scenario (the peer is 1.00x)",
	}
	for _, r := range results {
		ratio := 1.0
		if r.Sluice {
			ratio = r.RatioVsPeer
		}
		c.Bars = append(c.Bars, bar{Group: r.Scenario + ", " + plural(r.Callers, "caller"), Label: r.Store,
			Value: r.DecisionsPerSec, Ratio: ratio, Sluice: r.Sluice})
	}
	return c
}

// decideFunc makes one decision for one caller; callers never share one.
type decideFunc func(ctx context.Context) (allowed bool, err error)

// contender is one side of a comparison. setup builds fresh state for one measurement
// and returns how each caller decides, and its fallbacks.
type contender struct {
	name  string
	setup func(ctx context.Context, callers int) (newCaller func(id int) decideFunc, fallbacks fallbackFunc, err error)
}

// fallbackFunc returns how many decisions have fallen back from Redis to memory so
// far (which would flatter the figures); with release, it releases the contender's
// state as well, and is not called again.
type fallbackFunc func(release bool) (fallbacks int64)

// scenario pits sluice against its peer under the same load.
type scenario struct {
	name         string
	callers      int
	batch        int // decisions between looks at the clock-stop flag
	sluice, peer contender
}

type result struct {
	Scenario        string  `json:"scenario"`
	Store           string  `json:"store"`
	Sluice          bool    `json:"sluice"`
	Callers         int     `json:"callers"`
	Decisions       int64   `json:"decisions"`
	Denied          int64   `json:"denied"`
	Fallbacks       int64   `json:"fallbacks"` // Redis store decisions made in memory instead, in the measured window
	Seconds         float64 `json:"seconds"`
	DecisionsPerSec float64 `json:"decisions_per_second"`
	NsPerDecision   float64 `json:"ns_per_decision"`
	MeanLatencyNs   float64 `json:"mean_latency_ns"`
	RatioVsPeer     float64 `json:"ratio_vs_peer,omitempty"`
	// RatioMin and RatioMax are the lowest and highest RatioVsPeer of the rounds
	// (--rounds), of which this result is the median one.
	RatioMin float64 `json:"ratio_min,omitempty"`
	RatioMax float64 `json:"ratio_max,omitempty"`
	// FallbackRounds is how many of the rounds had decisions of sluice's Redis store
	// made in memory instead (Fallbacks, in any round), which flatter its ratios.
	FallbackRounds int `json:"fallback_rounds,omitempty"`
	// CPUNsPerDecision is the process's CPU time per decision; 0 where the platform
	// does not tell.
	CPUNsPerDecision float64 `json:"cpu_ns_per_decision,omitempty"`
	CPURatioVsPeer   float64 `json:"cpu_ratio_vs_peer,omitempty"`
}

func memoryScenarios(cfg limiterConfig) []scenario {
	procs := []int{1}
	if p := runtime.GOMAXPROCS(0); p > 1 {
		procs = append(procs, p)
	}
	var out []scenario
	for _, set := range []struct {
		name string
		keys int
		peer contender
	}{
		{"memory, 1 key", 1, xrateSingle()},
		{fmt.Sprintf("memory, %s keys", count(cfg.keys)), cfg.keys, xrateMap(cfg.keys)},
	} {
		for _, c := range procs {
			out = append(out, scenario{name: set.name, callers: c, batch: 256,
				sluice: sluiceMemory(set.keys), peer: set.peer})
		}
	}
	return out
}

// keyPicker draws keys at random, as real traffic does. Walking the keys in order would
// flatter whichever contender allocated its per-key state in that same order, since the
// hardware prefetcher would then hide the cache misses that dominate with many keys.
// It is an xorshift generator: a few nanoseconds, the same for every contender.
//
// Each key is written into the picker's buffer, shaped like the ingress's keys
// (rules.Check.Key: prefix, rule hash, limit, hash of the request's values), as the
// ingress writes the key of a request it has just read: its bytes are in the cache, and
// it is not the string a map holds for it. A table of prepared key strings would make
// every decision pay a cache miss of the tool's own to fetch the key, and would let Go's
// map compare its stored key with the very same string, by pointer.
type keyPicker struct {
	n   int // keys to draw from: 1 is one fixed key
	x   uint64
	buf []byte
}

// keyPrefix is the constant start of every benchmark key: domain, rule hash and limit.
const keyPrefix = "sl:bench:5f1c0a2e9b3d4c7a:tb1s:"

// keyDigits is the length of the per-key end (the ingress's is 22 base64url characters).
const keyDigits = 22

func newKeyPicker(n, id int) *keyPicker {
	buf := make([]byte, len(keyPrefix)+keyDigits)
	copy(buf, keyPrefix)
	p := &keyPicker{n: n, x: 0x9E3779B97F4A7C15 * uint64(id+1), buf: buf}
	p.write(0)
	return p
}

// next returns the next key. It is only valid until the following call: a contender
// that keeps a key must copy it.
func (p *keyPicker) next() string {
	if p.n > 1 {
		p.x ^= p.x << 13
		p.x ^= p.x >> 7
		p.x ^= p.x << 17
		// Multiply-shift maps the top 32 bits onto [0, n) without a division.
		p.write((p.x >> 32) * uint64(p.n) >> 32)
	}
	return unsafe.String(&p.buf[0], len(p.buf))
}

// write puts key i's end into the buffer: i in decimal, zero-padded.
func (p *keyPicker) write(i uint64) {
	for j := len(p.buf) - 1; j >= len(keyPrefix); j-- {
		p.buf[j] = byte('0' + i%10)
		i /= 10
	}
}

func sluiceMemory(keys int) contender {
	return contender{name: "sluice memory", setup: func(ctx context.Context, callers int) (func(int) decideFunc, fallbackFunc, error) {
		m := limiter.NewMemory()
		return func(id int) decideFunc {
			p := newKeyPicker(keys, id)
			return func(ctx context.Context) (bool, error) {
				d, err := m.AllowN(ctx, p.next(), benchLimit, 1)
				return d.Allowed, err
			}
		}, noFallbacks, nil
	}}
}

func xrateSingle() contender {
	return contender{name: "x/time/rate", setup: func(ctx context.Context, callers int) (func(int) decideFunc, fallbackFunc, error) {
		l := rate.NewLimiter(benchRate, benchBurst)
		return func(int) decideFunc {
			return func(context.Context) (bool, error) { return l.Allow(), nil }
		}, noFallbacks, nil
	}}
}

// rateMap is how x/time/rate is used per key: one Limiter per key in a map behind a
// mutex, created on first use.
type rateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (r *rateMap) allow(key string) bool {
	r.mu.Lock()
	l := r.m[key]
	if l == nil {
		l = rate.NewLimiter(benchRate, benchBurst)
		r.m[strings.Clone(key)] = l // key is the picker's buffer
	}
	r.mu.Unlock()
	return l.Allow()
}

func xrateMap(keys int) contender {
	return contender{name: "x/time/rate mutex map", setup: func(ctx context.Context, callers int) (func(int) decideFunc, fallbackFunc, error) {
		rm := &rateMap{m: make(map[string]*rate.Limiter, keys)}
		return func(id int) decideFunc {
			p := newKeyPicker(keys, id)
			return func(context.Context) (bool, error) { return rm.allow(p.next()), nil }
		}, noFallbacks, nil
	}}
}

func noFallbacks(bool) int64 { return 0 }

func runScenarios(ctx context.Context, cfg limiterConfig, scenarios []scenario, stderr io.Writer) ([]result, error) {
	p := newProgress(stderr, 2*len(scenarios)*cfg.rounds)
	defer p.done()
	var results []result
	for _, s := range scenarios {
		rounds := make([][2]result, 0, cfg.rounds)
		for range cfg.rounds {
			pair, err := measurePair(ctx, cfg, s, p)
			if err != nil {
				return nil, err
			}
			rounds = append(rounds, pair)
		}
		// The median round by ratio, and the spread of the ratios.
		slices.SortFunc(rounds, func(a, b [2]result) int { return cmp.Compare(a[1].RatioVsPeer, b[1].RatioVsPeer) })
		pair := rounds[len(rounds)/2]
		if len(rounds) > 1 {
			pair[1].RatioMin, pair[1].RatioMax = rounds[0][1].RatioVsPeer, rounds[len(rounds)-1][1].RatioVsPeer
		}
		for _, p := range rounds {
			if p[1].Fallbacks > 0 {
				pair[1].FallbackRounds++
			}
		}
		for _, pair := range rounds {
			for _, r := range pair {
				if r.Denied > 0 {
					fmt.Fprintf(stderr, "sluice-bench: warning: %s denied %d of %d requests; the figures include rejections\n", r.Store, r.Denied, r.Decisions)
				}
				if r.Fallbacks > 0 {
					fmt.Fprintf(stderr, "sluice-bench: warning: %s made %d decisions in memory because Redis was slow or failing; its figures flatter it\n", r.Store, r.Fallbacks)
				}
			}
		}
		results = append(results, pair[1], pair[0])
	}
	return results, nil
}

// measurePair measures s's peer, then sluice, and sets sluice's ratios.
func measurePair(ctx context.Context, cfg limiterConfig, s scenario, p *stepProgress) ([2]result, error) {
	// The peer goes first: if anything warms up over the run (caches, Redis), it
	// favours the peer rather than sluice.
	var pair [2]result
	for i, c := range []contender{s.peer, s.sluice} {
		p.step(fmt.Sprintf("%s, %s: %s", s.name, plural(s.callers, "caller"), c.name))
		r, err := measure(ctx, cfg, s, c)
		if err != nil {
			return pair, fmt.Errorf("%s, %s, %s: %w", s.name, plural(s.callers, "caller"), c.name, err)
		}
		r.Sluice = i == 1
		pair[i] = r
	}
	if pair[0].DecisionsPerSec > 0 {
		pair[1].RatioVsPeer = pair[1].DecisionsPerSec / pair[0].DecisionsPerSec
	}
	if pair[0].CPUNsPerDecision > 0 && pair[1].CPUNsPerDecision > 0 {
		pair[1].CPURatioVsPeer = pair[0].CPUNsPerDecision / pair[1].CPUNsPerDecision
	}
	return pair, nil
}

// counter is one caller's tally, on its own cache line so callers do not slow each
// other down by counting.
type counter struct {
	n, denied atomic.Int64
	_         [48]byte
}

// measure runs s.callers callers of c for cfg.warmup, then counts their decisions for
// cfg.duration, or until the first batch is counted if that takes longer. The callers keep running across the boundary, so the measured window
// sees a steady state rather than goroutines starting up.
func measure(ctx context.Context, cfg limiterConfig, s scenario, c contender) (result, error) {
	newCaller, fallbacks, err := c.setup(ctx, s.callers)
	if err != nil {
		return result{}, err
	}
	defer fallbacks(true)
	runtime.GC() // the previous measurement's garbage is not this one's cost

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	counts := make([]counter, s.callers)
	var stop atomic.Bool
	var errOnce sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for id := range s.callers {
		decide := newCaller(id)
		tally := &counts[id]
		wg.Go(func() {
			for !stop.Load() {
				denied := int64(0)
				for range s.batch {
					ok, err := decide(ctx)
					if err != nil {
						// After the end, errors are the cancellation of calls
						// under way, not failures.
						if !stop.Load() {
							errOnce.Do(func() { firstErr = err })
						}
						stop.Store(true)
						return
					}
					if !ok {
						denied++
					}
				}
				tally.n.Add(int64(s.batch))
				tally.denied.Add(denied)
			}
		})
	}
	total := func() (n, denied int64) {
		for i := range counts {
			n += counts[i].n.Load()
			denied += counts[i].denied.Load()
		}
		return n, denied
	}
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return !stop.Load()
		case <-ctx.Done():
			return false
		}
	}

	ok := sleep(cfg.warmup)
	n0, d0 := total()
	f0 := fallbacks(false)
	t0 := time.Now()
	cpu0, cpuKnown := processCPU()
	ok = ok && sleep(cfg.duration)
	n1, d1 := total()
	// Callers count whole batches: on a busy machine a short window can end before
	// any batch does, which would leave no figure. The window then runs on until one
	// does (elapsed is measured, so the rate stays right).
	for ok && n1 == n0 {
		ok = sleep(time.Millisecond)
		n1, d1 = total()
	}
	elapsed := time.Since(t0)
	cpu1, _ := processCPU()
	// Counted before the end cancels the calls under way, which then fall back.
	f1 := fallbacks(false)
	stop.Store(true)
	cancel()
	wg.Wait()
	switch {
	case firstErr != nil:
		return result{}, firstErr
	case !ok:
		return result{}, context.Cause(ctx)
	}

	r := result{Scenario: s.name, Store: c.name, Callers: s.callers, Decisions: n1 - n0,
		Denied: d1 - d0, Fallbacks: f1 - f0, Seconds: elapsed.Seconds()}
	if r.Decisions > 0 {
		r.DecisionsPerSec = float64(r.Decisions) / elapsed.Seconds()
		r.NsPerDecision = float64(elapsed.Nanoseconds()) / float64(r.Decisions)
		r.MeanLatencyNs = r.NsPerDecision * float64(s.callers)
		if cpuKnown {
			r.CPUNsPerDecision = float64((cpu1 - cpu0).Nanoseconds()) / float64(r.Decisions)
		}
	}
	return r, nil
}

func writeTable(w io.Writer, results []result) error {
	rows := [][]string{{"SCENARIO", "CALLERS", "STORE", "DECISIONS/S", "NS/DECISION", "LATENCY", "VS PEER", "CPU NS", "VS PEER (CPU)"}}
	for _, r := range results {
		ratio, cpuRatio, cpu := "", "", ""
		if r.Sluice && r.RatioVsPeer > 0 {
			ratio = fmt.Sprintf("%.2fx", r.RatioVsPeer)
			if r.RatioMax > 0 {
				ratio += fmt.Sprintf(" (%.2f-%.2f)", r.RatioMin, r.RatioMax)
			}
		}
		if r.Sluice && r.CPURatioVsPeer > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", r.CPURatioVsPeer)
		}
		if r.CPUNsPerDecision > 0 {
			cpu = fmt.Sprintf("%.1f", r.CPUNsPerDecision)
		}
		rows = append(rows, []string{r.Scenario, strconv.Itoa(r.Callers), r.Store,
			count(int(r.DecisionsPerSec)), fmt.Sprintf("%.1f", r.NsPerDecision), latency(r.MeanLatencyNs), ratio, cpu, cpuRatio})
	}
	if err := writeColumns(w, rows, []bool{true, false, true, false, false, false, false, false, false}); err != nil {
		return err
	}
	return writeGoals(w, results)
}

// limiterGoals are the stores' targets (issues 13 and 31): sluice's decisions per
// second over its peer's, in the scenarios the limiter mode runs, with callers
// callers (0: GOMAXPROCS).
var limiterGoals = []struct {
	keys    string // "1" or "many" (memory), "redis"
	callers int
	atLeast float64
}{
	{"1", 0, 1.2},
	{"many", 1, 3},
	{"many", 0, 3},
	{"redis", 1, 1.1},
	{"redis", 64, 3},
}

// goalScenario reports whether scenario is the one of goal keys.
func goalScenario(keys, scenario string) bool {
	switch keys {
	case "1":
		return scenario == "memory, 1 key"
	case "many":
		return strings.HasPrefix(scenario, "memory, ") && scenario != "memory, 1 key"
	}
	return strings.HasPrefix(scenario, "redis, ")
}

// writeGoals writes a line per goal whose scenario ran: its ratios by wall time and
// CPU time, and whether they meet it.
func writeGoals(w io.Writer, results []result) error {
	var b strings.Builder
	procs := runtime.GOMAXPROCS(0)
	seen := map[string]bool{} // with GOMAXPROCS=1, two goals are one
	for _, g := range limiterGoals {
		callers := g.callers
		if callers == 0 {
			callers = procs
		}
		k := fmt.Sprint(g.keys, callers)
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, r := range results {
			if !r.Sluice || r.Callers != callers || !goalScenario(g.keys, r.Scenario) {
				continue
			}
			verdict := func(ratio float64) string {
				if r.FallbackRounds > 0 {
					return fmt.Sprintf("%.2fx not shown (%s fell back to memory)", ratio, plural(r.FallbackRounds, "round"))
				}
				if ratio >= g.atLeast {
					return fmt.Sprintf("%.2fx met", ratio)
				}
				return fmt.Sprintf("%.2fx NOT met", ratio)
			}
			fmt.Fprintf(&b, "GOAL %s, %s: >= %gx the peer: wall %s", r.Scenario, plural(callers, "caller"), g.atLeast, verdict(r.RatioVsPeer))
			if r.CPURatioVsPeer > 0 {
				fmt.Fprintf(&b, ", CPU %s", verdict(r.CPURatioVsPeer))
			}
			b.WriteByte('\n')
		}
	}
	if b.Len() == 0 {
		return nil
	}
	_, err := io.WriteString(w, "\n"+b.String())
	return err
}

// writeColumns writes rows as aligned columns, text left and numbers right
// (leftAligned per column), which text/tabwriter cannot mix.
func writeColumns(w io.Writer, rows [][]string, leftAligned []bool) error {
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		line := make([]string, len(row))
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			if leftAligned[i] {
				line[i] = cell + pad
			} else {
				line[i] = pad + cell
			}
		}
		b.WriteString(strings.TrimRight(strings.Join(line, "  "), " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeJSON(w io.Writer, cfg limiterConfig, results []result) error {
	return writeJSONDoc(w, struct {
		runInfo
		Duration     string   `json:"duration"`
		Warmup       string   `json:"warmup"`
		Rounds       int      `json:"rounds"`
		Keys         int      `json:"keys"`
		Redis        bool     `json:"redis"`
		RedisKeys    int      `json:"redis_keys"`
		RedisCallers []int    `json:"redis_callers"`
		Results      []result `json:"results"`
	}{newRunInfo("limiter"), cfg.duration.String(), cfg.warmup.String(), cfg.rounds, cfg.keys, cfg.redisURL != "", cfg.redisKeys, cfg.redisCallers, results})
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// count writes n with thousands separators: 12,345,678.
func count(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// latency writes a duration with three significant digits: 74ns, 57.7µs, 565µs, 1.23ms.
func latency(ns float64) string {
	unit := time.Duration(1)
	for float64(unit)*1000 <= ns {
		unit *= 10
	}
	return time.Duration(ns).Round(unit).String()
}

// stepProgress tells on stderr what is being measured. On a terminal it rewrites one
// line; elsewhere (CI logs) it prints a line per measurement.
type stepProgress struct {
	line     *progress.Line
	total, n int
}

func newProgress(w io.Writer, total int) *stepProgress {
	return &stepProgress{line: progress.New(w), total: total}
}

func (p *stepProgress) step(what string) {
	p.n++
	s := fmt.Sprintf("[%d/%d] %s", p.n, p.total, what)
	if !p.line.Terminal() {
		s = "sluice-bench: " + s
	}
	p.line.Show(s)
}

func (p *stepProgress) done() { p.line.Clear() }
