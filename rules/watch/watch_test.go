package watch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// versioned is a rules file whose every part says which version it is: route rN has a
// limit of N per second, so a reader can tell whether route and rule come from one set.
func versioned(n int) string {
	return fmt.Sprintf(`domain: live
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: %d}
routes:
  - name: r%d
    descriptors: [[{key: ip, from: client_ip}]]
`, n, n)
}

const invalidRules = "domain: live\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"

// writeAtomic replaces name's content at once, as careful tools do, so the watcher
// never reads a half-written file.
func writeAtomic(t testing.TB, name, content string) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(name), ".tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(tmp, content); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing the test after a generous deadline. Tests
// wait for outcomes, never for durations.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rate is the limit of the active set's only rule.
func rate(w *Watcher) int64 { return w.Set().Rules()[0].Limits[0].Rate }

func counter(w *Watcher, result string) float64 {
	var m dto.Metric
	if err := w.reloads.WithLabelValues(result).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func watch(t *testing.T, paths []string, opts Options) *Watcher {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	opts.Debounce = 20 * time.Millisecond
	w, err := New(paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestWatchReloadsChangedFiles(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		byFile bool                                        // watch the file, not its directory
		change func(t *testing.T, dir, file string, n int) // makes version n current
	}{
		{"write in place", Options{}, false, func(t *testing.T, dir, file string, n int) {
			if err := os.WriteFile(file, []byte(versioned(n)), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"rename over the file", Options{}, true, func(t *testing.T, dir, file string, n int) {
			writeAtomic(t, file, versioned(n))
		}},
		{"editor: move away, write new", Options{}, true, func(t *testing.T, dir, file string, n int) {
			if err := os.Rename(file, file+"~"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(versioned(n)), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Remove(file + "~")
		}},
		{"new file in the directory", Options{}, false, func(t *testing.T, dir, file string, n int) {
			writeAtomic(t, filepath.Join(dir, "more.yaml"), fmt.Sprintf("domain: more%d\n", n))
			writeAtomic(t, file, versioned(n))
		}},
		{"polling", Options{Poll: true, PollInterval: 10 * time.Millisecond}, false, func(t *testing.T, dir, file string, n int) {
			writeAtomic(t, file, versioned(n))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := write(t, dir, "rules.yaml", versioned(1))
			path := dir
			if tc.byFile {
				path = file
			}
			var reloads atomic.Int32
			tc.opts.OnReload = func(r ReloadResult) {
				if r.Err == nil {
					reloads.Add(1)
				}
			}
			w := watch(t, []string{path}, tc.opts)
			for n := 2; n <= 3; n++ {
				tc.change(t, dir, file, n)
				waitFor(t, fmt.Sprintf("version %d", n), func() bool { return rate(w) == int64(n) })
			}
			// The set is visible before the counter and the callback: wait for them too.
			waitFor(t, "two successful reloads counted and reported", func() bool {
				return reloads.Load() >= 2 && counter(w, "success") >= 2
			})
			if f := counter(w, "failure"); f != 0 && tc.name != "write in place" {
				t.Errorf("%v failed reloads", f)
			}
		})
	}
}

// TestWatchConfigMapSwap reproduces how Kubernetes updates a ConfigMap volume: the
// files are symlinks through ..data, which is atomically repointed to a new directory.
func TestWatchConfigMapSwap(t *testing.T) {
	for _, byFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("watch file %v", byFile), func(t *testing.T) {
			dir := t.TempDir()
			version := func(n int) {
				ts := filepath.Join(dir, fmt.Sprintf("..2024_01_0%d", n))
				if err := os.Mkdir(ts, 0o755); err != nil {
					t.Fatal(err)
				}
				write(t, ts, "rules.yaml", versioned(n))
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
			}
			version(1)
			if err := os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(dir, "rules.yaml")); err != nil {
				t.Fatal(err)
			}
			path := dir
			if byFile {
				path = filepath.Join(dir, "rules.yaml")
			}
			w := watch(t, []string{path}, Options{})
			if rate(w) != 1 || len(w.Set().Files()) != 1 {
				t.Fatalf("initial set: %v", w.Set().Files())
			}
			for n := 2; n <= 3; n++ {
				version(n)
				os.RemoveAll(filepath.Join(dir, fmt.Sprintf("..2024_01_0%d", n-1)))
				waitFor(t, fmt.Sprintf("version %d", n), func() bool { return rate(w) == int64(n) })
			}
		})
	}
}

func TestWatchRefusesInvalidRules(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "rules.yaml", versioned(1))
	reg := prometheus.NewRegistry()
	results := make(chan ReloadResult, 10)
	w := watch(t, []string{dir}, Options{Registerer: reg, OnReload: func(r ReloadResult) { results <- r }})
	old := w.Set()

	writeAtomic(t, file, invalidRules)
	var res ReloadResult
	select {
	case res = <-results:
	case <-time.After(10 * time.Second):
		t.Fatal("no reload attempt")
	}
	var ps rules.Problems
	if !errors.As(res.Err, &ps) || !strings.Contains(ps.Error(), `unknown unit "fortnight"`) || res.Set != old {
		t.Fatalf("reload result = %+v", res)
	}
	if w.Set() != old || counter(w, "failure") != 1 || counter(w, "success") != 0 {
		t.Fatalf("after refusal: set changed %v, failure %v, success %v", w.Set() != old, counter(w, "failure"), counter(w, "success"))
	}
	// The same bad content is not refused (nor counted, nor logged) again.
	if err := w.Reload(); !errors.Is(err, rules.ErrInvalid) || counter(w, "failure") != 1 {
		t.Errorf("Reload = %v, failure %v", err, counter(w, "failure"))
	}
	writeAtomic(t, file, versioned(2))
	waitFor(t, "the fixed rules", func() bool { return rate(w) == 2 })
	if r := <-results; r.Err != nil || r.Set != w.Set() || counter(w, "success") != 1 {
		t.Errorf("result %+v, success = %v", r, counter(w, "success"))
	}
	// The metrics are on the registry given.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	if strings.Join(names, ",") != "sluice_rules_last_reload_success_timestamp_seconds,sluice_rules_reload_total" {
		t.Errorf("metrics %v", names)
	}
}

// TestWatchLogsEachProblemOnItsLine: a refused set is logged as its count and then one
// record per problem, in text logs one line each, in JSON logs one object each.
func TestWatchLogsEachProblemOnItsLine(t *testing.T) {
	const twoProblems = "domain: live\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: -1}\n"
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			file := write(t, dir, "rules.yaml", versioned(1))
			var logs lockedBuffer
			h := slog.Handler(slog.NewTextHandler(&logs, nil))
			if format == "json" {
				h = slog.NewJSONHandler(&logs, nil)
			}
			w := watch(t, []string{file}, Options{Poll: true, PollInterval: time.Hour, Logger: slog.New(h)})
			writeAtomic(t, file, twoProblems)
			if err := w.Reload(); !errors.Is(err, rules.ErrInvalid) {
				t.Fatalf("Reload = %v", err)
			}
			var refused, problems []string
			for _, line := range strings.Split(logs.String(), "\n") {
				switch {
				case strings.Contains(line, "rules: new rules refused"):
					refused = append(refused, line)
				case strings.Contains(line, "rules: problem of the refused rules"):
					problems = append(problems, line)
				}
			}
			if len(refused) != 1 || !strings.Contains(refused[0], map[string]string{"text": "problems=2", "json": `"problems":2`}[format]) {
				t.Errorf("refusal lines %q", refused)
			}
			if len(problems) != 2 || !strings.Contains(problems[0], `unknown unit \"fortnight\"`) || !strings.Contains(problems[1], "requests_per_unit must not be negative") {
				t.Fatalf("problem lines %q", problems)
			}
			if format == "json" {
				var rec struct {
					N, Of   int
					Problem string
				}
				if err := json.Unmarshal([]byte(problems[1]), &rec); err != nil || rec.N != 2 || rec.Of != 2 || !strings.HasPrefix(rec.Problem, file+":6:") {
					t.Errorf("record %s: %+v %v", problems[1], rec, err)
				}
			} else if strings.Contains(logs.String(), "[") {
				t.Errorf("a list in the text log:\n%s", logs.String())
			}
		})
	}
}

// TestWatchPrepareRefusesTheWholeSet: a set that Prepare refuses never becomes active:
// the old set keeps serving, the refusal is counted and logged once, and the same
// content is prepared again on the next attempt (what Prepare needs may come back);
// Prepare sees the new set before it is active; invalid rules are not prepared.
func TestWatchPrepareRefusesTheWholeSet(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "rules.yaml", versioned(1))
	errQueues := errors.New("queue orders: insufficient storage")
	var (
		mu       sync.Mutex
		refuse   = true
		prepared []int64 // the rate of each set prepared
		sawNew   bool    // Prepare ran while the new set was active
	)
	var w *Watcher
	var logs lockedBuffer
	results := make(chan ReloadResult, 10)
	// Reloads only when asked, so that every Prepare call is one the test made.
	w = watch(t, []string{dir}, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Poll: true, PollInterval: time.Hour,
		OnReload: func(r ReloadResult) { results <- r },
		Prepare: func(s *rules.Set) error {
			mu.Lock()
			defer mu.Unlock()
			prepared = append(prepared, s.Rules()[0].Limits[0].Rate)
			if w.Set() == s {
				sawNew = true
			}
			if refuse {
				return errQueues
			}
			return nil
		}})
	old := w.Set()
	preparedRates := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), prepared...)
	}

	writeAtomic(t, file, versioned(2))
	if err := w.Reload(); !errors.Is(err, ErrNotPrepared) || !errors.Is(err, errQueues) {
		t.Fatalf("Reload = %v", err)
	}
	if res := <-results; !errors.Is(res.Err, ErrNotPrepared) || res.Set != old {
		t.Fatalf("reload result = %+v", res)
	}
	if w.Set() != old || counter(w, "failure") != 1 || counter(w, "success") != 0 || fmt.Sprint(preparedRates()) != "[2]" {
		t.Fatalf("after refusal: set changed %v, failure %v, success %v, prepared %v",
			w.Set() != old, counter(w, "failure"), counter(w, "success"), preparedRates())
	}
	waitFor(t, "the refusal logged", func() bool {
		return strings.Contains(logs.String(), "rules: new rules refused") && strings.Contains(logs.String(), "insufficient storage")
	})
	// The same content is prepared again, refused again: neither counted nor logged again.
	if err := w.Reload(); !errors.Is(err, ErrNotPrepared) || w.Set() != old || counter(w, "failure") != 1 || fmt.Sprint(preparedRates()) != "[2 2]" {
		t.Fatalf("Reload = %v, failure %v, prepared %v", err, counter(w, "failure"), preparedRates())
	}
	if n := strings.Count(logs.String(), "rules: new rules refused"); n != 1 {
		t.Errorf("the refusal was logged %d times:\n%s", n, logs.String())
	}
	// Invalid rules are refused before Prepare.
	writeAtomic(t, file, invalidRules)
	if err := w.Reload(); !errors.Is(err, rules.ErrInvalid) || fmt.Sprint(preparedRates()) != "[2 2]" || counter(w, "failure") != 2 {
		t.Fatalf("invalid rules: Reload = %v, prepared %v, failure %v", err, preparedRates(), counter(w, "failure"))
	}
	// Back to the refused content, once Prepare accepts: active.
	mu.Lock()
	refuse = false
	mu.Unlock()
	writeAtomic(t, file, versioned(2))
	if err := w.Reload(); err != nil || rate(w) != 2 || counter(w, "success") != 1 {
		t.Fatalf("Reload = %v, rate %d, success %v", err, rate(w), counter(w, "success"))
	}
	mu.Lock()
	defer mu.Unlock()
	if sawNew {
		t.Error("Prepare ran after its set became active")
	}
	if fmt.Sprint(prepared) != "[2 2 2]" {
		t.Errorf("prepared %v", prepared)
	}
}

func TestWatchUnreadableFilesAreRefused(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "rules.yaml", versioned(1))
	w := watch(t, []string{file}, Options{Poll: true, PollInterval: time.Hour})
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); !errors.Is(err, rules.ErrInvalid) || rate(w) != 1 {
		t.Errorf("Reload after removal = %v", err)
	}
	writeAtomic(t, file, versioned(2))
	if err := w.Reload(); err != nil || rate(w) != 2 {
		t.Errorf("Reload after restore = %v, rate %d", err, rate(w))
	}
}

func TestWatchSameContentIsNotAReload(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "rules.yaml", versioned(1))
	w := watch(t, []string{dir}, Options{Poll: true, PollInterval: time.Hour})
	before := w.Set()
	writeAtomic(t, file, versioned(1))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if w.Set() != before || counter(w, "success") != 0 {
		t.Error("identical content replaced the set")
	}
	// Going back to the active content after a refusal clears the refusal.
	writeAtomic(t, file, invalidRules)
	if err := w.Reload(); err == nil {
		t.Fatal("invalid rules accepted")
	}
	writeAtomic(t, file, versioned(1))
	if err := w.Reload(); err != nil || w.Set() != before {
		t.Errorf("Reload = %v", err)
	}
	writeAtomic(t, file, invalidRules)
	if err := w.Reload(); err == nil || counter(w, "failure") != 2 {
		t.Errorf("Reload = %v, failures %v", err, counter(w, "failure"))
	}
}

// TestWatchConcurrentReaders runs readers against reloads under -race: each reader
// sees one whole set, old or new, never a route of one version with a rule of another.
func TestWatchConcurrentReaders(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "rules.yaml", versioned(1))
	w := watch(t, []string{dir}, Options{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var matches atomic.Int64
	var mixed atomic.Value
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(g)})
			buf := make([]rules.Check, 0, 4)
			r := httptest.NewRequest("GET", "/any", nil)
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := w.Set()
				rt, cs := s.Match(r, ip, buf[:0])
				if rt == nil || len(cs) != 1 || "r"+strconv.FormatInt(cs[0].Rule.Limits[0].Rate, 10) != rt.Name {
					mixed.Store(fmt.Sprintf("route %v with checks %v", rt, cs))
					return
				}
				matches.Add(1)
			}
		}()
	}
	last := 1
	for n := 2; n <= 40; n++ {
		writeAtomic(t, file, versioned(n))
		if n%2 == 0 {
			// Half of the versions through Reload, half through file events.
			if err := w.Reload(); err != nil {
				t.Fatal(err)
			}
		} else {
			waitFor(t, fmt.Sprintf("version %d", n), func() bool { return rate(w) >= int64(n) })
		}
		if n%10 == 0 {
			writeAtomic(t, file, invalidRules)
			if err := w.Reload(); err == nil {
				t.Fatal("invalid rules accepted")
			}
		}
		last = n
	}
	writeAtomic(t, file, versioned(last))
	waitFor(t, "readers to make progress", func() bool { return matches.Load() > 100 })
	close(stop)
	wg.Wait()
	if m := mixed.Load(); m != nil {
		t.Fatalf("a reader saw a mixed set: %v", m)
	}
	if rate(w) != int64(last) {
		t.Errorf("final version %d, want %d", rate(w), last)
	}
}

func TestWatchLifecycle(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "rules.yaml", versioned(1))
	reg := prometheus.NewRegistry()
	w, err := New([]string{dir}, Options{Registerer: reg, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New([]string{dir}, Options{Registerer: reg, Logger: quietLogger()}); err == nil {
		t.Error("a second watcher registered the same metrics")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := w.Reload(); !errors.Is(err, ErrClosed) {
		t.Errorf("Reload after Close = %v", err)
	}
	if w.Set() == nil {
		t.Error("no set after Close")
	}
	// Close unregistered the metrics: a new watcher can register them again.
	w2, err := New([]string{dir}, Options{Registerer: reg, Logger: quietLogger(), Poll: true})
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()

	write(t, dir, "bad.yaml", invalidRules)
	if _, err := New([]string{dir}, Options{}); !errors.Is(err, rules.ErrInvalid) {
		t.Errorf("Watch of invalid rules = %v", err)
	}
	if _, err := New(nil, Options{}); !errors.Is(err, rules.ErrNoPaths) {
		t.Errorf("New() = %v", err)
	}
}

// lockedBuffer is a log destination that the watcher's goroutine and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWatchRefusesNonRulesFilesWithoutQuotingThem: a rules file replaced by a symlink
// to a file that is no rules file (passwd, a key, an env file, another program's
// YAML, broken YAML naming an anchor) is refused, and neither the error nor the log
// carries a byte of it: only the file, the position and a plain message.
func TestWatchRefusesNonRulesFilesWithoutQuotingThem(t *testing.T) {
	const secret = "hunter2-S3CR3T-wJalrXUtnFEMI"
	for _, tc := range []struct {
		name, content, want string
	}{
		{"passwd", "root:x:0:0:" + secret + ":/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n",
			":1:1: not a rules file: the top level must be a mapping with a domain, got a string"},
		{"env file", "AWS_SECRET_ACCESS_KEY=" + secret + "\nDB_PASSWORD=" + secret + "\n",
			":1:1: not a rules file: the top level must be a mapping with a domain, got a string"},
		{"private key", "-----BEGIN PRIVATE KEY-----\n" + secret + "\n-----END PRIVATE KEY-----\n",
			":1:1: not a rules file: the top level must be a mapping with a domain, got a string"},
		{"number", "4111111111111111\n", ":1:1: not a rules file: the top level must be a mapping with a domain, got a whole number"},
		{"list", "- " + secret + "\n", ":1:1: not a rules file: the top level must be a mapping with a domain, got a list"},
		{"other YAML", "db_password: " + secret + "\n" + secret + ": x\n",
			":1:1: not a rules file: none of its top-level fields is one of domain, descriptors, routes, queues, shadow_mode"},
		{"unknown anchor", "domain: *" + secret + "\n", ":1:9: invalid YAML: unknown anchor referenced"},
		{"broken YAML", "password: '" + secret + "\n", ":1:11: invalid YAML: found unexpected end of stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := write(t, dir, "rules.yaml", versioned(1))
			target := write(t, t.TempDir(), "target", tc.content)
			var logs lockedBuffer
			w := watch(t, []string{file}, Options{Poll: true, PollInterval: time.Hour,
				Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, file); err != nil {
				t.Fatal(err)
			}
			err := w.Reload()
			var ps rules.Problems
			if !errors.As(err, &ps) || rate(w) != 1 {
				t.Fatalf("Reload = %v, rate %d: want refused, old rules serving", err, rate(w))
			}
			if got := ps.Error(); !strings.Contains(got, file+tc.want) {
				t.Errorf("problems:\n%s\nwant %q", got, file+tc.want)
			}
			waitFor(t, "the refusal logged", func() bool { return strings.Contains(logs.String(), "rules: new rules refused") })
			for what, text := range map[string]string{"error": ps.Error(), "log": logs.String()} {
				for _, leak := range []string{secret, "root:x", "4111111111111111", "AWS_SECRET", "db_password", "PRIVATE KEY"} {
					if strings.Contains(text, leak) {
						t.Errorf("the %s quotes the file (%q):\n%s", what, leak, text)
					}
				}
			}
		})
	}
}

// TestWatchMergeDomains: a watcher with MergeDomains reloads a domain split over files,
// and takes a new file of the domain in.
func TestWatchMergeDomains(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	write(t, dir, "b.yaml", "domain: shop\ndescriptors:\n  - key: plan\n    rate_limit: {unit: second, requests_per_unit: 50}\n")
	if _, err := New([]string{dir}, Options{Logger: quietLogger(), Poll: true, PollInterval: time.Hour}); err == nil {
		t.Fatal("a watcher without MergeDomains loaded a shared domain")
	}
	w := watch(t, []string{dir}, Options{MergeDomains: true, Poll: true, PollInterval: time.Hour})
	write(t, dir, "c.yaml", "domain: shop\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 9}\n")
	if err := w.Reload(); err != nil {
		t.Fatalf("reload of a third file of the domain: %v", err)
	}
	cs := w.Set().Evaluate("shop", [][]rules.Entry{{{Key: "ip", Value: "1"}}}, nil)
	if len(cs) != 1 || len(cs[0].Rule.Limits) != 1 || cs[0].Rule.Limits[0].Rate != 9 {
		t.Errorf("after reload: %+v", cs)
	}
}

func write(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWatchRefusesBadOptions: a negative interval is an error, never silently the
// default.
func TestWatchRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "rules.yaml", versioned(1))
	for _, opts := range []Options{
		{PollInterval: -time.Second},
		{Debounce: -time.Millisecond},
		{Poll: true, PollInterval: -1},
	} {
		w, err := New([]string{dir}, opts)
		if !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New with %+v = %v, want ErrInvalidOptions", opts, err)
		}
		if w != nil {
			w.Close()
		}
	}
}

// Bad Options are refused, not silently replaced by the defaults.
func TestWatchBadOptions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(file, []byte(versioned(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_rules_last_reload_success_timestamp_seconds", Help: "not sluice's"}))
	for name, opts := range map[string]Options{
		"clashing registry": {Registerer: clash},
	} {
		if w, err := New([]string{file}, opts); err == nil {
			w.Close()
			t.Errorf("%s: Watch succeeded", name)
		}
	}
	w, err := New([]string{file}, Options{Poll: true}) // zero values: the defaults
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}
