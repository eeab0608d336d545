// Package watch keeps a rules set current while its files change: fsnotify, with
// polling as a fallback. It is a package of its own so that programs that load rules
// once (rules.Load) do not link fsnotify.
package watch

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// Errors of a Watcher that callers branch on.
var (
	// ErrClosed is returned by Watcher.Reload after Close.
	ErrClosed = errors.New("rules watcher closed")
	// ErrNotPrepared is matched by the error of a reload that Options.Prepare
	// refused: the rules are valid, but what they need (their queues) is not ready.
	ErrNotPrepared = errors.New("rules not activated")
	// ErrInvalidOptions: an Options field is out of range (a negative interval).
	ErrInvalidOptions = errors.New("rules watcher: invalid options")
)

// Options configure a Watcher. The zero value watches with fsnotify, falls back to
// polling every 5 seconds when fsnotify cannot be used, logs to slog.Default and
// registers no metrics.
type Options struct {
	// Logger receives reloads and refusals; nil means slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the watcher's metrics:
	// sluice_rules_reload_total{result="success"|"failure"} and
	// sluice_rules_last_reload_success_timestamp_seconds. Close unregisters them.
	Registerer prometheus.Registerer
	// Poll makes the watcher poll instead of using fsnotify (for file systems without
	// change notification, such as some network mounts).
	Poll bool
	// PollInterval is how often content is compared when polling; default 5s (0).
	// Negative: New fails with ErrInvalidOptions, as for Debounce.
	PollInterval time.Duration
	// Debounce is how long the watcher waits after a file event for more events before
	// it reloads, so an editor's save (write, rename, chmod) or a ConfigMap swap is read
	// once, complete; 0 means 100ms, a negative value is an error.
	Debounce time.Duration
	// Prepare, when set, is called with every valid new set before it becomes active,
	// from the goroutine that reloads (the watcher's, or Reload's caller), one call at
	// a time. The sluice command declares the set's queues in it, so that a set goes
	// live only once every queue it names exists. When it returns nil the set becomes
	// active at once; an error refuses the set as invalid rules are refused (logged,
	// counted as a failure, the active set keeps serving), with one difference: since
	// what Prepare needs may come back, the same content is prepared again on the next
	// reload attempt (a file event, a poll, Reload), though a repeated refusal is
	// neither counted nor logged again. The first load (Watch) is not prepared.
	Prepare func(*rules.Set) error
	// OnReload, when set, is called after every reload attempt that found changed
	// content (but not after a repeated refusal of the same content), from the
	// goroutine that reloaded. It must not block for long.
	OnReload func(ReloadResult)
	// MergeDomains lets several files share a domain (see the option rules.MergeDomains).
	MergeDomains bool
}

func (o *Options) loadOptions() []rules.Option {
	if o.MergeDomains {
		return []rules.Option{rules.MergeDomains()}
	}
	return nil
}

// ReloadResult reports one reload attempt.
type ReloadResult struct {
	// Set is the active set after the attempt: the new one, or the old one when Err is
	// set.
	Set *rules.Set
	// Err is why the new content was refused (rules.Problems for invalid rules, an error
	// wrapping ErrNotPrepared when Options.Prepare refused it); nil when the new
	// set was activated.
	Err error
}

// Watcher keeps the current rules set of some paths, reloading it when the files change.
// A new set replaces the old one atomically: Set returns either the old or the new set,
// never a mix. Content that fails validation is refused, logged with its problems and
// counted, and the old set keeps serving. Identical content (a touch, a rewrite with
// the same bytes) is not a reload.
//
// Changes are noticed through fsnotify on the directories that hold the paths (the
// directory itself and its parent for a directory path, the containing directory for a
// file path), which also catches editors that write a new file and rename it over the
// old one and Kubernetes ConfigMap volumes, which swap a ..data symlink. When fsnotify
// cannot be used, or fails later, the watcher polls instead.
type Watcher struct {
	paths []string
	opts  Options
	log   *slog.Logger

	cur atomic.Pointer[rules.Set]

	mu         sync.Mutex // serialises reloads
	failedVer  string     // content that was last refused, not refused again
	failedErr  error
	retryVer   string // content that Prepare refused, prepared again on every attempt
	reloads    *prometheus.CounterVec
	lastOK     prometheus.Gauge
	registered bool

	fsw     *fsnotify.Watcher
	polling bool
	// Which file events matter: the given paths themselves, rules files in a given
	// directory, and Kubernetes' ..data entries next to a given file or in a given
	// directory.
	given     map[string]bool
	givenDirs map[string]bool
	fileDirs  map[string]bool
	done      chan struct{}
	wg        sync.WaitGroup
	once      sync.Once
}

// New loads the rules at paths (as rules.Load does) and keeps them current until Close. It
// fails when the first load fails (with rules.Problems for invalid rules) or the metrics
// cannot be registered.
func New(paths []string, opts Options) (*Watcher, error) {
	if len(paths) == 0 {
		return nil, rules.ErrNoPaths
	}
	if opts.PollInterval < 0 || opts.Debounce < 0 {
		return nil, fmt.Errorf("%w: PollInterval %s and Debounce %s must not be negative (0: the default)",
			ErrInvalidOptions, opts.PollInterval, opts.Debounce)
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Second
	}
	if opts.Debounce == 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	w := &Watcher{paths: append([]string(nil), paths...), opts: opts, log: opts.Logger, done: make(chan struct{}),
		given: map[string]bool{}, givenDirs: map[string]bool{}, fileDirs: map[string]bool{}}
	if w.log == nil {
		w.log = slog.Default()
	}
	s, err := rules.LoadWith(paths, opts.loadOptions()...)
	if err != nil {
		return nil, err
	}
	w.cur.Store(s)
	w.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rules_reload_total",
		Help: "Rules reloads after a change of the rules files, by result: success (the new set is active) or failure (refused; the old set keeps serving).",
	}, []string{"result"})
	w.reloads.WithLabelValues("success")
	w.reloads.WithLabelValues("failure")
	w.lastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_rules_last_reload_success_timestamp_seconds",
		Help: "Unix time at which the active rules set was loaded.",
	})
	w.lastOK.SetToCurrentTime()
	if reg := opts.Registerer; reg != nil {
		if err := reg.Register(w.reloads); err != nil {
			return nil, fmt.Errorf("rules: registering metrics: %w", err)
		}
		if err := reg.Register(w.lastOK); err != nil {
			reg.Unregister(w.reloads)
			return nil, fmt.Errorf("rules: registering metrics: %w", err)
		}
		w.registered = true
	}
	w.polling = opts.Poll
	if !w.polling {
		if err := w.startNotify(); err != nil {
			w.log.Warn("rules: file notifications unavailable, polling instead", "error", err, "interval", opts.PollInterval)
			w.polling = true
		}
	}
	w.wg.Add(1)
	go w.run()
	return w, nil
}

// Set returns the active rules set. Hold on to it for the whole of a request.
func (w *Watcher) Set() *rules.Set { return w.cur.Load() }

// Reload reads the files now (for SIGHUP, say) and activates them if they changed and
// are valid. It returns why they were refused, or nil.
func (w *Watcher) Reload() error {
	select {
	case <-w.done:
		return ErrClosed
	default:
	}
	return w.reload("request")
}

// Close stops watching and waits for the watcher's goroutines to end. The last set
// stays readable through Set.
func (w *Watcher) Close() error {
	var err error
	w.once.Do(func() {
		close(w.done)
		w.wg.Wait()
		if w.fsw != nil {
			err = w.fsw.Close()
		}
		if w.registered {
			w.opts.Registerer.Unregister(w.reloads)
			w.opts.Registerer.Unregister(w.lastOK)
		}
	})
	return err
}

// watchDirs are the directories whose events may change the rules.
func (w *Watcher) watchDirs() []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	for _, p := range w.paths {
		p = filepath.Clean(p)
		w.given[p] = true
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			w.givenDirs[p] = true
			add(p)
		} else {
			w.fileDirs[filepath.Dir(p)] = true
		}
		// The parent sees the path itself being replaced: a file renamed over, a
		// directory symlink swapped.
		add(filepath.Dir(p))
	}
	return dirs
}

// relevant reports whether an event on name may change the rules. Other files that
// share a directory with the rules (logs, editors' swap files) do not cause reloads.
func (w *Watcher) relevant(name string) bool {
	name = filepath.Clean(name)
	if w.given[name] {
		return true
	}
	dir, base := filepath.Dir(name), filepath.Base(name)
	k8s := strings.HasPrefix(base, "..") // ..data, ..data_tmp, ..2024_01_01_…
	switch {
	case w.givenDirs[dir]:
		return k8s || strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")
	case w.fileDirs[dir]:
		return k8s
	}
	return false
}

func (w *Watcher) startNotify() error {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	for _, d := range w.watchDirs() {
		if err := fsw.Add(d); err != nil {
			fsw.Close()
			return fmt.Errorf("watching %s: %w", d, err)
		}
	}
	w.fsw = fsw
	return nil
}

// rewatch re-adds the watched directories after a change: when a directory was
// replaced (a symlink now points elsewhere) the watch follows it to the new one.
func (w *Watcher) rewatch() {
	if w.fsw == nil {
		return
	}
	for _, d := range w.watchDirs() {
		if err := w.fsw.Add(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("rules: re-watching directory", "dir", d, "error", err)
		}
	}
}

func (w *Watcher) run() {
	defer w.wg.Done()
	var (
		events  chan fsnotify.Event
		errs    chan error
		ticker  *time.Ticker
		tick    <-chan time.Time
		debounc *time.Timer
		fire    <-chan time.Time
	)
	startPolling := func() {
		ticker = time.NewTicker(w.opts.PollInterval)
		tick = ticker.C
	}
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
		if debounc != nil {
			debounc.Stop()
		}
	}()
	if w.polling {
		startPolling()
	} else {
		events, errs = w.fsw.Events, w.fsw.Errors
	}
	for {
		select {
		case <-w.done:
			return
		case ev, ok := <-events:
			if !ok {
				w.log.Warn("rules: file notifications stopped, polling instead", "interval", w.opts.PollInterval)
				events, errs = nil, nil
				startPolling()
				continue
			}
			if ev.Op == fsnotify.Chmod || !w.relevant(ev.Name) {
				continue
			}
			// Reload once the burst of events is over, but a steady stream of events
			// must not postpone it for ever: the timer is not pushed back.
			if fire == nil {
				if debounc == nil {
					debounc = time.NewTimer(w.opts.Debounce)
				} else {
					debounc.Reset(w.opts.Debounce)
				}
				fire = debounc.C
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflow lost events: read the files to be sure.
			w.log.Warn("rules: file notification error", "error", err)
			w.reload("notification error")
		case <-fire:
			fire = nil
			w.reload("file change")
			w.rewatch()
		case <-tick:
			w.reload("poll")
		}
	}
}

func (w *Watcher) reload(why string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	files, err := rules.ReadFiles(w.paths...)
	ver := rules.FilesVersion(files)
	if err != nil {
		// The files are not all readable: remember the refusal by its message.
		ver = "unreadable:" + err.Error()
	}
	old := w.cur.Load()
	if ver == old.Version() {
		w.failedVer, w.failedErr, w.retryVer = "", nil, ""
		return nil
	}
	if ver == w.failedVer {
		return w.failedErr
	}
	var s *rules.Set
	if err == nil {
		s, err = rules.ParseWith(files, w.opts.loadOptions()...)
	}
	if err == nil && w.opts.Prepare != nil {
		if err = w.opts.Prepare(s); err != nil {
			err = fmt.Errorf("%w: %w", ErrNotPrepared, err)
			repeated := ver == w.retryVer
			w.retryVer = ver
			if repeated {
				w.log.Debug("rules: new rules still refused; the active rules keep serving", "trigger", why,
					"version", short(ver), "active_version", short(old.Version()), "error", err)
				return err
			}
			w.reloads.WithLabelValues("failure").Inc()
			w.log.Error("rules: new rules refused; the active rules keep serving; retried on the next reload attempt", "trigger", why,
				"version", short(ver), "active_version", short(old.Version()), "error", err)
			if w.opts.OnReload != nil {
				w.opts.OnReload(ReloadResult{Set: old, Err: err})
			}
			return err
		}
	}
	w.retryVer = ""
	if err != nil {
		w.failedVer, w.failedErr = ver, err
		w.reloads.WithLabelValues("failure").Inc()
		var ps rules.Problems
		if errors.As(err, &ps) {
			// One record per problem, each a line of its own (a list in one attribute
			// is a Go slice on one line in text logs), after the count.
			w.log.Error("rules: new rules refused; the active rules keep serving", "trigger", why,
				"active_version", short(old.Version()), "problems", len(ps))
			for i, p := range ps {
				w.log.Error("rules: problem of the refused rules", "n", i+1, "of", len(ps), "problem", p.String())
			}
		} else {
			w.log.Error("rules: new rules refused; the active rules keep serving", "trigger", why,
				"active_version", short(old.Version()), "error", err)
		}
		if w.opts.OnReload != nil {
			w.opts.OnReload(ReloadResult{Set: old, Err: err})
		}
		return err
	}
	w.cur.Store(s)
	w.failedVer, w.failedErr = "", nil
	w.reloads.WithLabelValues("success").Inc()
	w.lastOK.SetToCurrentTime()
	w.log.Info("rules: reloaded", "trigger", why, "version", short(s.Version()), "previous_version", short(old.Version()), "summary", s.Summary().String())
	if w.opts.OnReload != nil {
		w.opts.OnReload(ReloadResult{Set: s})
	}
	return nil
}

func short(v string) string {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}
