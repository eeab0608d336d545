package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/cmd/internal/progress"
	"github.com/sluicehq/sluice/limiter"
)

const simulateHelp = `Usage: sluice simulate --algorithm NAME [rule flags] [--trace FILE] [--json] [--redis URL]

Replays a trace of requests through one rule on a simulated clock and prints what the
rule decides for each request: the tool for tuning bucket sizes, rates and windows
before going live.

Rule flags:
  token_bucket                    --bucket-size N --refill-rate RATE
  leaky_bucket                    --bucket-size N --outflow-rate RATE
  fixed_window                    --limit N --window DURATION
  sliding_window_log              --limit N --window DURATION [--forgive-rejected]
  sliding_window_counter          --limit N --window DURATION
RATE is N/UNIT with UNIT s, m, h, d or a Go duration: 4/m, 10/30s, 100/1m30s.

Trace (--trace FILE, or standard input): one request per line, "OFFSET [KEY [N]]".
OFFSET is a Go duration from the start of the trace (0s, 1.5s, 1m40s), never smaller
than the line before; KEY defaults to "-", N (units, for weighted requests) to 1.
Blank lines and everything after a "#" are ignored. The simulated clock starts at
2000-01-01T00:00:00Z, aligned to every whole second, minute, hour and day window, and
keeps time to the microsecond.

Output: one line per request, in input order,
  OFFSET KEY allow|deny remaining=R retry_after=D
(D a Go duration; "never" when N exceeds what the rule can ever grant), then
  allowed=A denied=D
With --json, JSON Lines instead: one object per request
  {"line":3,"offset":"1.5s","key":"-","n":1,"decision":"allow","allowed":true,
   "limit":5,"remaining":4,"retry_after":"0s","reset_after":"500ms"}
("retry_after":"never" as above), then one last object {"summary":{"allowed":A,"denied":D}}.

The whole trace is read and checked before anything runs: a bad line or flag prints one
message naming it on stderr and exits with status 2, without any table. Status 1 means
the run itself failed (for example Redis could not be reached).
`

// simulateStart is the simulated clock's origin: offset 0 is aligned to every whole
// second, minute, hour and day window, so traces give the same result on any day.
var simulateStart = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// request is one parsed trace line.
type request struct {
	line   int
	offset time.Duration
	key    string
	n      int64
}

// outcome is a request and the rule's decision on it.
type outcome struct {
	request
	limiter.Decision
}

// simulateFlags are simulate's flags.
type simulateFlags struct {
	algorithm               string
	limit, bucketSize       int64
	window                  time.Duration
	refillRate, outflowRate string
	forgive, asJSON         bool
	redisURL, tracePath     string
}

func simulateCommand(stdout, stderr io.Writer) *cobra.Command {
	var f simulateFlags
	c := withEnv(&cobra.Command{
		Use:   "simulate",
		Short: "replay a trace of requests through one rule on a simulated clock",
		Long:  simulateHelp,
		Args:  cobra.ArbitraryArgs, // refused below, with a word on where the trace comes from
		RunE: func(c *cobra.Command, args []string) error {
			return status(runSimulate(c.Context(), c.Flags(), &f, args, stdout, stderr))
		},
	})
	fs := c.Flags()
	fs.StringVar(&f.algorithm, "algorithm", "", "`name` of the algorithm: "+algorithmNames())
	fs.Int64Var(&f.limit, "limit", 0, "requests per window (window algorithms)")
	fs.DurationVar(&f.window, "window", 0, "window length as a Go `duration` (window algorithms)")
	fs.Int64Var(&f.bucketSize, "bucket-size", 0, "bucket size (token_bucket, leaky_bucket)")
	fs.StringVar(&f.refillRate, "refill-rate", "", "token refill `rate` N/UNIT (token_bucket)")
	fs.StringVar(&f.outflowRate, "outflow-rate", "", "outflow `rate` N/UNIT (leaky_bucket)")
	fs.BoolVar(&f.forgive, "forgive-rejected", false, "do not record rejected requests (sliding_window_log)")
	fs.StringVar(&f.redisURL, "redis", "", "run the trace on the Redis store at this `URL` (redis://host:port/db) instead of in memory")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON Lines instead of text")
	fs.StringVar(&f.tracePath, "trace", "", "read the trace from `file` instead of standard input")
	completeFlagValues(c)
	return c
}

// runSimulate runs sluice simulate with the flags that cobra parsed into fs and f.
func runSimulate(ctx context.Context, fs *pflag.FlagSet, f *simulateFlags, args []string, stdout, stderr io.Writer) int {
	src, ok := loadFlags(fs, stderr)
	if !ok {
		return exitUsage
	}
	fromEnv := src.names(srcEnv)
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice simulate: "+format+"\n", a...)
		return exitUsage
	}
	if len(args) > 0 {
		return fail("unexpected argument %q (the trace comes from --trace FILE or standard input)", args[0])
	}

	given := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { given[f.Name] = true })
	l, err := ruleFromFlags(ruleFlags{
		given: given, fromEnv: fromEnv,
		algorithm: f.algorithm, limit: f.limit, window: f.window, bucketSize: f.bucketSize,
		refillRate: f.refillRate, outflowRate: f.outflowRate, forgive: f.forgive,
	})
	if err != nil {
		return fail("%v", err)
	}

	reqs, err := readTrace(f.tracePath, stderr)
	if err != nil {
		return fail("%v", err)
	}

	// The simulated clock is read by the store on the same goroutine that moves it, so
	// it needs no lock.
	now := simulateStart
	clock := func() time.Time { return now }
	var store limiter.Limiter = limiter.NewMemory(limiter.WithClock(clock))
	var onRedis *redisSimulation
	if f.redisURL != "" {
		if onRedis, err = newRedisSimulation(ctx, f.redisURL, clock, stderr); err != nil {
			fmt.Fprintf(stderr, "sluice simulate: --redis: %v\n", err)
			return exitFailure
		}
		defer func() {
			if err := onRedis.close(); err != nil {
				fmt.Fprintf(stderr, "sluice simulate: --redis: removing the simulation's keys: %v\n", err)
			}
		}()
		store = onRedis
	}

	results, err := replay(ctx, store, l, reqs, func(offset time.Duration) { now = simulateStart.Add(offset) }, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: %v\n", err)
		return exitFailure
	}
	if onRedis != nil {
		if err := onRedis.check(); err != nil {
			fmt.Fprintf(stderr, "sluice simulate: --redis: %v; no result printed\n", err)
			return exitFailure
		}
	}

	w := bufio.NewWriter(stdout)
	if f.asJSON {
		err = writeJSON(w, results)
	} else {
		err = writeText(w, results)
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: writing the result: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// readTrace reads and checks the whole trace, of the file at path or of standard
// input, before anything is decided, so that bad input never leaves a partial table
// behind. Its errors name the file (and the line).
func readTrace(path string, stderr io.Writer) ([]request, error) {
	var in io.Reader = os.Stdin
	name := "stdin"
	if path == "" && progress.IsTerminal(os.Stdin) {
		// Otherwise a forgotten --trace looks like a hang.
		fmt.Fprintln(stderr, "sluice simulate: reading the trace from the terminal; end it with Ctrl-D (or pass --trace FILE)")
	}
	if path != "" {
		file, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		defer file.Close()
		in, name = file, path
	}
	reqs, err := parseTrace(in)
	if err != nil {
		if te := (*traceError)(nil); errors.As(err, &te) {
			return nil, fmt.Errorf("%s:%d: %w", name, te.line, te.err)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return reqs, nil
}

// replay decides each request on store under l, in order, with the simulated clock
// moved to its offset first (at), and shows its progress on stderr. It stops at the
// first error of the store, or when ctx ends.
func replay(ctx context.Context, store limiter.Limiter, l limiter.Limit, reqs []request, at func(time.Duration), stderr io.Writer) ([]outcome, error) {
	prog := newProgress(stderr, len(reqs), "requests")
	defer prog.done()
	results := make([]outcome, 0, len(reqs))
	for i, r := range reqs {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("interrupted: %w", err)
			}
			prog.update(i)
		}
		at(r.offset)
		d, err := store.AllowN(ctx, r.key, l, r.n)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", r.line, err)
		}
		results = append(results, outcome{r, d})
	}
	return results, nil
}

func algorithmNames() string { return strings.Join(limiter.AlgorithmNames(), ", ") }

// ruleFlags are simulate's rule flags, with which of them were given (on the command
// line or through the environment) so that a contradiction can be named.
type ruleFlags struct {
	given, fromEnv map[string]bool

	algorithm               string
	limit, bucketSize       int64
	window                  time.Duration
	refillRate, outflowRate string
	forgive                 bool
}

// ruleFromFlags builds the rule, naming the flag at fault: a missing one, one that the
// algorithm does not take, or a bad value.
func ruleFromFlags(f ruleFlags) (limiter.Limit, error) {
	name := func(flagName string) string {
		if f.fromEnv[flagName] {
			return fmt.Sprintf("--%s (from %s)", flagName, envName(flagName))
		}
		return "--" + flagName
	}
	alg := limiter.Algorithm(f.algorithm)
	switch {
	case f.algorithm == "":
		return limiter.Limit{}, fmt.Errorf("--algorithm is required: one of %s", algorithmNames())
	case !alg.Valid():
		return limiter.Limit{}, fmt.Errorf("%s: unknown algorithm %q (want one of %s)", name("algorithm"), f.algorithm, algorithmNames())
	}

	var need, forbid []string
	switch alg {
	case limiter.TokenBucket:
		need, forbid = []string{"bucket-size", "refill-rate"}, []string{"outflow-rate", "limit", "window", "forgive-rejected"}
	case limiter.LeakyBucket:
		need, forbid = []string{"bucket-size", "outflow-rate"}, []string{"refill-rate", "limit", "window", "forgive-rejected"}
	case limiter.SlidingWindowLog:
		need, forbid = []string{"limit", "window"}, []string{"bucket-size", "refill-rate", "outflow-rate"}
	default:
		need, forbid = []string{"limit", "window"}, []string{"bucket-size", "refill-rate", "outflow-rate", "forgive-rejected"}
	}
	for _, n := range need {
		if !f.given[n] {
			return limiter.Limit{}, fmt.Errorf("%s needs --%s", alg, n)
		}
	}
	for _, n := range forbid {
		if f.given[n] {
			hint := ""
			switch {
			case alg == limiter.TokenBucket && n == "outflow-rate":
				hint = "; a token bucket refills, use --refill-rate"
			case alg == limiter.LeakyBucket && n == "refill-rate":
				hint = "; a leaky bucket drains, use --outflow-rate"
			}
			return limiter.Limit{}, fmt.Errorf("%s does not apply to %s%s", name(n), alg, hint)
		}
	}

	l := limiter.Limit{Algorithm: alg, ForgiveRejected: f.forgive}
	switch alg {
	case limiter.TokenBucket, limiter.LeakyBucket:
		if f.bucketSize <= 0 {
			return limiter.Limit{}, fmt.Errorf("%s must be positive, got %d", name("bucket-size"), f.bucketSize)
		}
		rateFlag, rateText := "refill-rate", f.refillRate
		if alg == limiter.LeakyBucket {
			rateFlag, rateText = "outflow-rate", f.outflowRate
		}
		r, err := limiter.ParseRate(rateText)
		if err == nil {
			err = checkPeriod(r.Period)
		}
		if err != nil {
			return limiter.Limit{}, fmt.Errorf("%s: %w", name(rateFlag), err)
		}
		l.Rate, l.Period, l.Burst = r.Count, r.Period, f.bucketSize
	default:
		if f.limit <= 0 {
			return limiter.Limit{}, fmt.Errorf("%s must be positive, got %d", name("limit"), f.limit)
		}
		if err := checkPeriod(f.window); err != nil {
			return limiter.Limit{}, fmt.Errorf("%s: %w", name("window"), err)
		}
		l.Rate, l.Period = f.limit, f.window
	}
	if err := l.Validate(); err != nil {
		return limiter.Limit{}, fmt.Errorf("the rule is not valid: %w", err)
	}
	return l, nil
}

// checkPeriod rejects periods the limiter cannot keep exactly: it counts whole
// microseconds, and silently rounding would change the rule being tuned.
func checkPeriod(d time.Duration) error {
	switch {
	case d <= 0:
		return fmt.Errorf("duration must be positive, got %v", d)
	case d%time.Microsecond != 0:
		return fmt.Errorf("duration %v is not a whole number of microseconds", d)
	}
	return nil
}

// maxTraceLine bounds one trace line, so a binary file given by mistake fails fast.
const maxTraceLine = 64 << 10

// traceError is a problem with one line of a trace.
type traceError struct {
	line int
	err  error
}

func (e *traceError) Error() string { return fmt.Sprintf("line %d: %v", e.line, e.err) }
func (e *traceError) Unwrap() error { return e.err }

// parseTrace reads a whole trace. Its error names the line at fault.
func parseTrace(r io.Reader) ([]request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxTraceLine)
	var reqs []request
	var last time.Duration
	line := 0
	for sc.Scan() {
		line++
		req, ok, err := parseTraceLine(sc.Text())
		if err != nil {
			return nil, &traceError{line, err}
		}
		if !ok {
			continue
		}
		if req.offset < last {
			return nil, &traceError{line, fmt.Errorf("offset %v goes back before %v (lines must be in time order)", req.offset, last)}
		}
		last = req.offset
		req.line = line
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &traceError{line + 1, fmt.Errorf("line longer than %d bytes", maxTraceLine)}
		}
		return nil, fmt.Errorf("reading the trace: %w", err)
	}
	return reqs, nil
}

// parseTraceLine reads "OFFSET [KEY [N]]"; ok is false for a blank or comment line.
func parseTraceLine(text string) (req request, ok bool, err error) {
	if i := strings.IndexByte(text, '#'); i >= 0 {
		text = text[:i]
	}
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return request{}, false, nil
	}
	if len(fields) > 3 {
		return request{}, false, fmt.Errorf("%d fields, want OFFSET [KEY [N]]", len(fields))
	}
	req = request{key: "-", n: 1}
	if req.offset, err = time.ParseDuration(fields[0]); err != nil {
		return request{}, false, fmt.Errorf("offset %q is not a Go duration like 0s, 1.5s or 1m40s", fields[0])
	}
	switch {
	case req.offset < 0:
		return request{}, false, fmt.Errorf("offset %q is negative", fields[0])
	case req.offset%time.Microsecond != 0:
		return request{}, false, fmt.Errorf("offset %q is finer than the simulated clock's microsecond", fields[0])
	case req.offset > maxOffset:
		return request{}, false, fmt.Errorf("offset %q is beyond %v", fields[0], maxOffset)
	}
	if len(fields) > 1 {
		req.key = fields[1]
	}
	if len(fields) > 2 {
		if req.n, err = strconv.ParseInt(fields[2], 10, 64); err != nil || req.n < 1 {
			return request{}, false, fmt.Errorf("N %q is not a positive whole number", fields[2]) //nolint:staticcheck // ST1005: N is the trace field's name
		}
	}
	return req, true, nil
}

// maxOffset keeps simulated times well inside what the stores count in microseconds.
const maxOffset = 100 * 365 * 24 * time.Hour

func retryText(d time.Duration) string {
	if d == limiter.Never {
		return "never"
	}
	return d.String()
}

func writeText(w io.Writer, results []outcome) error {
	allowed := 0
	for _, r := range results {
		verdict := "deny"
		if r.Allowed {
			verdict = "allow"
			allowed++
		}
		if _, err := fmt.Fprintf(w, "%v %s %s remaining=%d retry_after=%s\n",
			r.offset, r.key, verdict, r.Remaining, retryText(r.RetryAfter)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "allowed=%d denied=%d\n", allowed, len(results)-allowed)
	return err
}

type jsonOutcome struct {
	Line       int    `json:"line"`
	Offset     string `json:"offset"`
	Key        string `json:"key"`
	N          int64  `json:"n"`
	Decision   string `json:"decision"`
	Allowed    bool   `json:"allowed"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	RetryAfter string `json:"retry_after"`
	ResetAfter string `json:"reset_after"`
}

type jsonSummary struct {
	Summary struct {
		Allowed int `json:"allowed"`
		Denied  int `json:"denied"`
	} `json:"summary"`
}

func writeJSON(w io.Writer, results []outcome) error {
	enc := json.NewEncoder(w)
	var sum jsonSummary
	for _, r := range results {
		o := jsonOutcome{Line: r.line, Offset: r.offset.String(), Key: r.key, N: r.n,
			Decision: "deny", Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
			RetryAfter: retryText(r.RetryAfter), ResetAfter: r.ResetAfter.String()}
		if r.Allowed {
			o.Decision = "allow"
			sum.Summary.Allowed++
		} else {
			sum.Summary.Denied++
		}
		if err := enc.Encode(o); err != nil {
			return err
		}
	}
	return enc.Encode(sum)
}
