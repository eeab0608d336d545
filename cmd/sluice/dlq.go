package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

const dlqHelp = `Usage: sluice dlq list|requeue|purge QUEUE [TICKET…] [flags]

Inspects and recovers the dead letters of a queue: the orders that ran out of delivery
attempts.

  list     prints them (only the given tickets, if any): ticket, queue, attempts,
           reason and when they died; --json for scripts
  requeue  moves them (all, or the given tickets) back into the queue; each keeps its
           ticket and starts again with no failed attempts
  purge    deletes them (all, or the given tickets) for good; requires --yes

By default it works through the admin API of a running sluice, as sluice queue does:
--admin URL (default http://127.0.0.1:9090, the default --admin-listen; the token in
--admin-token or SLUICE_ADMIN_TOKEN); list then shows at most 10,000. When nothing
answers at the default, no sluice runs there, and it opens the default --data-dir
itself. Given --nats (from any source) it connects to that NATS instead, and given
--data-dir it starts the embedded NATS server on that directory. That works only while
no sluice runs there: a running sluice serve, ingress or dispatch holds its data
directory, so use its --admin, or start it with --nats-listen ADDR and
--nats-listen-token (or SLUICE_NATS_LISTEN_TOKEN), and pass --nats nats://ADDR and the
token (--nats-token or SLUICE_NATS_TOKEN) here. An encrypted data directory needs its
--encryption-key here too. --config FILE reads the
NATS flags and --admin-token from the config file of those commands (its other keys
are ignored); --json, --limit and --yes are never read from a file.

Exit status: 0 done, 1 failed (NATS unreachable, unknown queue or ticket, queue full),
2 bad usage (including purge without --yes).
`

type dlqConfig struct {
	nats  natsConfig
	admin adminClientConfig
	// adminDefault: --admin is its default, neither given nor replaced by --nats or
	// --data-dir (see dlqCommand).
	adminDefault bool
	json         bool
	yes          bool
	limit        int
}

func dlqCommand(stdout, stderr io.Writer) *cobra.Command {
	var cfg dlqConfig
	c := withEnv(&cobra.Command{
		Use:   "dlq",
		Short: "list, re-queue or purge a queue's dead letters",
		Long:  dlqHelp,
		// Flags may come after the action, queue and tickets too: sluice dlq list orders --json.
		Args:      cobra.ArbitraryArgs,
		ValidArgs: []cobra.Completion{"list", "requeue", "purge"},
		RunE: func(c *cobra.Command, args []string) error {
			src, ok := loadFlags(c.Flags(), stderr)
			if !ok {
				return exitStatus(exitUsage)
			}
			// The admin API of a running sluice by default, as sluice queue; --nats or
			// --data-dir (from any source) names the queues directly instead.
			_, admin := src.source["admin"]
			_, nats := src.source["nats"]
			_, dataDir := src.source["data-dir"]
			switch {
			case admin:
			case nats || dataDir:
				cfg.admin.url = ""
			default:
				cfg.adminDefault = true
			}
			return status(runDLQ(c.Context(), &cfg, args, stdout, stderr))
		},
	})
	fs := c.Flags()
	cfg.nats.flags(fs, false)
	cfg.admin.flags(fs, defaultAdminURL)
	fs.BoolVar(&cfg.json, "json", false, "list: print a JSON array instead of a table")
	fs.IntVar(&cfg.limit, "limit", 0, "list: print at most `n` dead letters, oldest first (0: all)")
	fs.BoolVar(&cfg.yes, "yes", false, "purge: really delete the dead letters")
	// The NATS flags can come from the file that serve, ingress or dispatch read.
	configFlags(fs, nil)
	return c
}

// runDLQ runs sluice dlq ACTION QUEUE [TICKET…] with the flags in cfg.
func runDLQ(ctx context.Context, cfg *dlqConfig, args []string, stdout, stderr io.Writer) int {
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice dlq: "+format+"\n", a...)
		fmt.Fprintln(stderr, "Run 'sluice dlq -h' for its usage.")
		return exitUsage
	}
	if len(args) < 2 {
		return usageErr("want an action (list, requeue or purge) and a queue")
	}
	action, queueName, tickets := args[0], args[1], args[2:]
	if err := checkDLQArgs(cfg, action, queueName, tickets); err != nil {
		return usageErr("%v", err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice dlq %s: %v\n", action, err)
		return exitFailure
	}
	if cfg.admin.url != "" {
		c, err := newAdminClient(cfg.admin)
		if err != nil {
			return usageErr("%v", err)
		}
		d := &dlq{ctx: ctx, queue: queueName, tickets: tickets, stdout: stdout, stderr: stderr}
		err = d.viaAdmin(c, action, cfg.json, cfg.limit)
		switch {
		case err == nil:
			return exitOK
		case !cfg.adminDefault || !errors.Is(err, syscall.ECONNREFUSED):
			return fail(err)
		}
		// Nothing listens at the default address, so no sluice runs there: the data
		// directory is free to open (it is an error below if it holds nothing).
		fmt.Fprintf(stderr, "sluice dlq: no sluice answers at --admin %s; opening --data-dir %s\n", cfg.admin.url, cfg.nats.dataDir)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := cfg.nats.check(log); err != nil {
		return usageErr("%v", err)
	}

	store, conn, err := openDLQStore(ctx, cfg, log)
	if err != nil {
		return fail(err)
	}
	defer conn.close()
	d := &dlq{ctx: ctx, store: store, queue: queueName, tickets: tickets, stdout: stdout, stderr: stderr}
	switch action {
	case "list":
		err = d.list(cfg.json, cfg.limit)
	case "requeue":
		err = d.requeue()
	case "purge":
		err = d.purge()
	}
	if err != nil {
		return fail(err)
	}
	return exitOK
}

// checkDLQArgs checks the action, the queue and the tickets of sluice dlq, and the
// flags that go with them.
func checkDLQArgs(cfg *dlqConfig, action, queueName string, tickets []string) error {
	if action != "list" && action != "requeue" && action != "purge" {
		return fmt.Errorf("unknown action %q%s: want list, requeue or purge", action, suggestAction(action, "list", "requeue", "purge"))
	}
	if !queueconfig.ValidName(queueName) {
		return fmt.Errorf("%q is not a queue name (1 to 64 letters, digits, _ or -)", queueName)
	}
	for _, t := range tickets {
		if !queue.ValidTicket(t) {
			return fmt.Errorf("%q is not a ticket (26 characters of a-z and 2-7)", t)
		}
	}
	if action == "purge" && !cfg.yes {
		return errors.New("purge deletes dead letters for good; add --yes to do it")
	}
	if cfg.limit < 0 {
		return errors.New("--limit must not be negative")
	}
	return nil
}

// openDLQStore opens the queues directly, on --nats or the embedded server in
// --data-dir (which must hold sluice data and not be held by a running sluice),
// for sluice dlq; close the connection when done.
func openDLQStore(ctx context.Context, cfg *dlqConfig, log *slog.Logger) (*queue.Store, *natsConn, error) {
	if cfg.nats.url == "" {
		// Starting an embedded server on a directory that holds no sluice data would
		// create an empty one and report an empty queue: a wrong --data-dir must be
		// an error, not silence.
		if _, err := os.Stat(filepath.Join(cfg.nats.dataDir, "jetstream")); err != nil {
			return nil, nil, fmt.Errorf("no sluice data in --data-dir %s (give the directory sluice serve uses, or --nats URL): %w", cfg.nats.dataDir, err)
		}
	}
	// Requeueing carries dead letters of any size back.
	cfg.nats.maxBody = queueconfig.MaxMaxBody
	conn, err := openNATS(cfg.nats, log, false)
	if errors.Is(err, errDataDirLocked) {
		return nil, nil, fmt.Errorf("%w.\nThat process runs the embedded NATS server on it, so sluice dlq cannot open it: "+
			"go through its admin API instead, --admin http://ADDR of its --admin-listen (the default, %s, when it runs with the default), "+
			"with its --admin-token if it has one", err, defaultAdminURL)
	}
	if err != nil {
		return nil, nil, err
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	replicas, err := conn.replicaCount()
	if err != nil {
		conn.close()
		return nil, nil, err
	}
	store, err := queue.Open(openCtx, conn.nc, queue.WithReplicas(replicas), queue.WithLogger(log),
		queue.WithIdempotencyMaxBytes(conn.idemMax), queue.WithSigningKey(conn.key))
	if err != nil {
		conn.close()
		return nil, nil, err
	}
	return store, conn, nil
}

// dlq runs one action on the dead letters of a queue.
type dlq struct {
	ctx            context.Context
	store          *queue.Store
	queue          string
	tickets        []string // empty: all
	stdout, stderr io.Writer
}

// deadLetters returns the queue's dead letters (the asked-for tickets only, if any)
// and the asked-for tickets that have none. A queue name that names nothing is an
// error, so that a typo does not read as "no dead letters".
func (d *dlq) deadLetters(limit int) (found []queue.DeadLetter, missing []string, err error) {
	all, err := d.store.DeadLetters(d.ctx, d.queue, 0)
	if err != nil {
		return nil, nil, err
	}
	if len(all) == 0 {
		if err := d.checkQueue(); err != nil {
			return nil, nil, err
		}
	}
	seen := map[string]bool{}
	for _, dl := range all {
		if len(d.tickets) > 0 && !slices.Contains(d.tickets, dl.Message.Ticket) {
			continue
		}
		seen[dl.Message.Ticket] = true
		if limit <= 0 || len(found) < limit {
			found = append(found, dl)
		}
	}
	for _, t := range d.tickets {
		if !seen[t] && !slices.Contains(missing, t) {
			missing = append(missing, t)
		}
	}
	return found, missing, nil
}

// checkQueue returns an error saying that there is no such queue when its stream is
// missing.
func (d *dlq) checkQueue() error {
	ctx, cancel := context.WithTimeout(d.ctx, 10*time.Second)
	defer cancel()
	if err := d.store.CheckQueue(ctx, d.queue); err != nil {
		if errors.Is(err, queue.ErrUnknownQueue) {
			return err
		}
		return fmt.Errorf("queue %q: %w", d.queue, err)
	}
	return nil
}

func missingError(queueName string, missing []string) error {
	return fmt.Errorf("%w: no dead letter in queue %q with ticket %s", queue.ErrNotFound, queueName, strings.Join(missing, ", "))
}

func (d *dlq) list(asJSON bool, limit int) error {
	found, missing, err := d.deadLetters(limit)
	if err != nil {
		return err
	}
	views := make([]queueapi.DeadLetterView, 0, len(found))
	for _, dl := range found {
		views = append(views, queueapi.NewDeadLetterView(d.queue, dl))
	}
	if err := d.print(views, asJSON); err != nil {
		return err
	}
	if len(missing) > 0 {
		return missingError(d.queue, missing)
	}
	return nil
}

// print writes dead letters as a table, or as a JSON array ([] for none, through the
// admin API and the data directory alike, never null).
func (d *dlq) print(views []queueapi.DeadLetterView, asJSON bool) error {
	if views == nil {
		views = []queueapi.DeadLetterView{}
	}
	if asJSON {
		enc := json.NewEncoder(d.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	}
	if len(views) == 0 {
		fmt.Fprintf(d.stderr, "no dead letters in queue %s\n", d.queue)
		return nil
	}
	tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TICKET\tQUEUE\tATTEMPTS\tREASON\tDEAD AT")
	for _, v := range views {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", v.Ticket, d.queue, v.Attempts, shorten(v.Reason, 72), v.DeadAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// viaAdmin runs the action through a running sluice's admin API.
func (d *dlq) viaAdmin(c *adminClient, action string, asJSON bool, limit int) error {
	path := "/sluice/v1/queues/" + d.queue + "/dead"
	selection := map[string]any{"all": true}
	if len(d.tickets) > 0 {
		selection = map[string]any{"tickets": d.tickets}
	}
	switch action {
	case "list":
		var out struct {
			DeadLetters []queueapi.DeadLetterView `json:"dead_letters"`
		}
		if err := c.do(d.ctx, http.MethodGet, path, url.Values{"limit": {"10000"}}, nil, &out); err != nil {
			return err
		}
		var views []queueapi.DeadLetterView
		seen := map[string]bool{}
		for _, v := range out.DeadLetters {
			if len(d.tickets) > 0 && !slices.Contains(d.tickets, v.Ticket) {
				continue
			}
			seen[v.Ticket] = true
			if limit <= 0 || len(views) < limit {
				views = append(views, v)
			}
		}
		if err := d.print(views, asJSON); err != nil {
			return err
		}
		var missing []string
		for _, t := range d.tickets {
			if !seen[t] && !slices.Contains(missing, t) {
				missing = append(missing, t)
			}
		}
		if len(missing) > 0 {
			return missingError(d.queue, missing)
		}
	case "requeue":
		var out struct {
			Requeued int `json:"requeued"`
		}
		if err := c.do(d.ctx, http.MethodPost, path+"/requeue", nil, selection, &out); err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "requeued %d dead letters to queue %s\n", out.Requeued, d.queue)
	case "purge":
		var out struct {
			Purged int `json:"purged"`
		}
		if err := c.do(d.ctx, http.MethodDelete, path, url.Values{"confirm": {"true"}}, selection, &out); err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "purged %d dead letters of queue %s\n", out.Purged, d.queue)
	}
	return nil
}

// shorten keeps a table readable; --json has the whole reason.
func shorten(s string, n int) string {
	if s == "" {
		return "-"
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// requeue moves the dead letters back in chunks, so that progress can be shown: each
// chunk is one queue.Store.Requeue call (which scans the dead letters once), and the
// chunk size keeps the number of scans near twenty whatever the count.
func (d *dlq) requeue() error {
	found, missing, err := d.deadLetters(0)
	if err != nil {
		return err
	}
	tickets := make([]string, len(found))
	for i, dl := range found {
		tickets[i] = dl.Message.Ticket
	}
	chunk := max(100, len(tickets)/20)
	prog := newProgress(d.stderr, len(tickets), "dead letters")
	moved := 0
	for len(tickets) > 0 {
		n := min(chunk, len(tickets))
		k, err := d.store.Requeue(d.ctx, d.queue, tickets[:n]...)
		moved += k
		prog.update(moved)
		if err != nil {
			prog.done()
			fmt.Fprintf(d.stdout, "requeued %d of %d dead letters to queue %s\n", moved, len(found), d.queue)
			if errors.Is(err, queue.ErrFull) {
				return fmt.Errorf("the queue is full; the rest stay dead letters (run requeue again later): %w", err)
			}
			return err
		}
		tickets = tickets[n:]
	}
	prog.done()
	fmt.Fprintf(d.stdout, "requeued %d dead letters to queue %s\n", moved, d.queue)
	if len(missing) > 0 {
		return missingError(d.queue, missing)
	}
	return nil
}

func (d *dlq) purge() error {
	if len(d.tickets) == 0 {
		n, err := d.store.PurgeDeadLetters(d.ctx, d.queue)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := d.checkQueue(); err != nil {
				return err
			}
		}
		fmt.Fprintf(d.stdout, "purged %d dead letters of queue %s\n", n, d.queue)
		return nil
	}
	prog := newProgress(d.stderr, len(d.tickets), "dead letters")
	purged := 0
	var missing []string
	for _, t := range d.tickets {
		n, err := d.store.PurgeDeadLetters(d.ctx, d.queue, t)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			missing = append(missing, t)
		case err != nil:
			prog.done()
			fmt.Fprintf(d.stdout, "purged %d dead letters of queue %s\n", purged, d.queue)
			return fmt.Errorf("purge %s: %w", t, err)
		}
		purged += n
		prog.update(purged + len(missing))
	}
	prog.done()
	if purged == 0 {
		if err := d.checkQueue(); err != nil {
			return err
		}
	}
	fmt.Fprintf(d.stdout, "purged %d dead letters of queue %s\n", purged, d.queue)
	if len(missing) > 0 {
		return missingError(d.queue, missing)
	}
	return nil
}
