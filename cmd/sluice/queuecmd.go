package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

const queueHelp = `Usage: sluice queue list|show|pause|resume|retire|delivery-key|flow [QUEUE] [flags]

Operates the queues of a running sluice through its admin API (--admin, the address
of its --admin-listen; the token of its --admin-token in --admin-token or
SLUICE_ADMIN_TOKEN).

  list            every queue: depth, oldest wait, outflow configured and achieved,
                  pause, and whether it is orphaned (left the rules, still draining)
  show QUEUE      one queue, in full
  pause QUEUE     stop its deliveries on every replica: --for 15m or --until TIME
  resume QUEUE    end a pause, also one a downstream's Retry-After set
  retire QUEUE    delete an orphaned queue once it is empty; --drop deletes the
                  orders and dead letters it still holds
  flow ACTION QUEUE [KEY]
                  the flow keys of a queue with flow_by: list the keys with settings
                  or orders, show one (its depth and achieved rate), pause
                  (--for/--until) or resume one, pin its rate (rate QUEUE KEY 2/s, or
                  default)
  delivery-key QUEUE
                  print the key the consumers of a nats: queue verify its orders and
                  sign its results with (package queue/subscriber), derived from the
                  signing key in SLUICE_QUEUE_KEY; needs no running sluice

--json prints the API's JSON instead of a table.

Exit status: 0 done, 1 failed (sluice unreachable, unknown queue, refused), 2 bad usage.
`

type queueCmdConfig struct {
	admin adminClientConfig
	json  bool
	drop  bool
	pause string
	until string
}

// defaultAdminURL is where sluice queue and sluice dlq look for a running sluice
// without --admin: the default --admin-listen.
const defaultAdminURL = "http://127.0.0.1:9090"

// adminClientConfig is how a tool reaches a running sluice's admin API.
type adminClientConfig struct {
	url   string
	token string
}

func (c *adminClientConfig) flags(fs *pflag.FlagSet, def string) {
	fs.StringVar(&c.url, "admin", def, "`URL` of a running sluice's admin listener (its --admin-listen)")
	fs.StringVar(&c.token, "admin-token", "", "bearer `token` of the admin API (best from SLUICE_ADMIN_TOKEN)")
}

func queueCommand(stdout, stderr io.Writer) *cobra.Command {
	var cfg queueCmdConfig
	c := withEnv(&cobra.Command{
		Use:       "queue",
		Short:     "list, show, pause, resume or retire the queues of a running sluice",
		Long:      queueHelp,
		Args:      cobra.ArbitraryArgs,
		ValidArgs: []cobra.Completion{"list", "show", "pause", "resume", "retire", "delivery-key", "flow"},
		RunE: func(c *cobra.Command, args []string) error {
			if _, ok := loadFlags(c.Flags(), stderr); !ok {
				return exitStatus(exitUsage)
			}
			return status(runQueue(c.Context(), &cfg, args, stdout, stderr))
		},
	})
	fs := c.Flags()
	cfg.admin.flags(fs, defaultAdminURL)
	fs.BoolVar(&cfg.json, "json", false, "print JSON instead of a table")
	fs.BoolVar(&cfg.drop, "drop", false, "retire: also delete the orders and dead letters the queue still holds")
	fs.StringVar(&cfg.pause, "for", "", "pause, flow pause: how long, a `duration` such as 15m")
	fs.StringVar(&cfg.until, "until", "", "pause, flow pause: until this RFC 3339 `time`")
	return c
}

// runQueue runs sluice queue ACTION [QUEUE] with the flags in cfg.
func runQueue(ctx context.Context, cfg *queueCmdConfig, args []string, stdout, stderr io.Writer) int {
	usageErr := func(err error) int {
		fmt.Fprintf(stderr, "sluice queue: %v\n", err)
		fmt.Fprintln(stderr, "Run 'sluice queue -h' for its usage.")
		return exitUsage
	}
	if len(args) > 0 && args[0] == "flow" {
		return runQueueFlow(ctx, cfg, args[1:], stdout, stderr)
	}
	action, name, err := parseQueueCmd(args)
	if err != nil {
		return usageErr(err)
	}
	if action == "delivery-key" {
		return runDeliveryKey(name, stdout, stderr)
	}
	if err := cfg.checkPause(action); err != nil {
		return usageErr(err)
	}
	c, err := newAdminClient(cfg.admin)
	if err != nil {
		return usageErr(err)
	}
	raw, err := cfg.queueCall(ctx, c, action, name)
	if err == nil {
		if cfg.json {
			_, _ = stdout.Write(raw)
		} else {
			err = printQueueAnswer(stdout, action, raw)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue %s: %v\n", action, err)
		return exitFailure
	}
	return exitOK
}

// parseQueueCmd checks the arguments of sluice queue but flow's and returns the
// action and the queue it names ("" for list); its errors say what is wrong.
func parseQueueCmd(args []string) (action, name string, err error) {
	if len(args) < 1 {
		return "", "", errors.New("want an action: list, show, pause, resume, retire, delivery-key or flow")
	}
	switch action = args[0]; action {
	case "list":
		if len(args) != 1 {
			return "", "", errors.New("list takes no queue")
		}
	case "show", "pause", "resume", "retire", "delivery-key":
		if len(args) != 2 {
			return "", "", fmt.Errorf("%s takes one queue", action)
		}
		if name = args[1]; !queueconfig.ValidName(name) {
			return "", "", fmt.Errorf("%q is not a queue name (1 to 64 letters, digits, _ or -)", name)
		}
	default:
		return "", "", fmt.Errorf("unknown action %q%s: want list, show, pause, resume, retire, delivery-key or flow", action,
			suggestAction(action, "list", "show", "pause", "resume", "retire", "delivery-key", "flow"))
	}
	return action, name, nil
}

// checkPause fails when action is pause (a queue's or a flow key's) without exactly
// one of --for and --until.
func (cfg *queueCmdConfig) checkPause(action string) error {
	if action == "pause" && (cfg.pause == "") == (cfg.until == "") {
		return errors.New("pause needs --for DURATION or --until TIME (one of them)")
	}
	return nil
}

// queueCall makes action's call of the admin API for queue name ("" for list) and
// returns the JSON it answered.
func (cfg *queueCmdConfig) queueCall(ctx context.Context, c *adminClient, action, name string) (json.RawMessage, error) {
	path := "/sluice/v1/queues"
	if name != "" {
		path += "/" + name
	}
	var raw json.RawMessage
	var err error
	switch action {
	case "list", "show":
		err = c.do(ctx, http.MethodGet, path, nil, nil, &raw)
	case "pause", "resume":
		err = cfg.pauseOrResume(ctx, c, action, path, &raw)
	case "retire":
		q := url.Values{}
		if cfg.drop {
			q.Set("drop", "true")
		}
		err = c.do(ctx, http.MethodPost, path+"/retire", q, nil, &raw)
	}
	return raw, err
}

// printQueueAnswer prints raw, the admin API's answer to action, for a reader: the
// queues as a table, or what retire did.
func printQueueAnswer(w io.Writer, action string, raw json.RawMessage) error {
	switch action {
	case "list":
		var out struct {
			Queues []queueapi.QueueView `json:"queues"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return err
		}
		printQueues(w, out.Queues)
	case "retire":
		var out struct {
			Retired string `json:"retired"`
			Dropped uint64 `json:"dropped"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return err
		}
		fmt.Fprintf(w, "retired queue %s (%d orders dropped)\n", out.Retired, out.Dropped)
	default:
		var v queueapi.QueueView
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		printQueues(w, []queueapi.QueueView{v})
	}
	return nil
}

// pauseOrResume posts action ("pause", with --for or --until, or "resume") to
// path (a queue's, or one flow key's).
func (cfg *queueCmdConfig) pauseOrResume(ctx context.Context, c *adminClient, action, path string, out *json.RawMessage) error {
	if action == "resume" {
		return c.do(ctx, http.MethodPost, path+"/resume", nil, nil, out)
	}
	q := url.Values{}
	if cfg.pause != "" {
		q.Set("for", cfg.pause)
	} else {
		q.Set("until", cfg.until)
	}
	return c.do(ctx, http.MethodPost, path+"/pause", q, nil, out)
}

func printQueues(w io.Writer, qs []queueapi.QueueView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tDEPTH\tIN FLIGHT\tOLDEST WAIT\tOUTFLOW\tACHIEVED\tPAUSED UNTIL\tORPHANED")
	for _, q := range qs {
		achieved := "-"
		if q.Outflow.AchievedPerSecond != nil {
			achieved = fmt.Sprintf("%.3g/s over %gs", *q.Outflow.AchievedPerSecond, q.Outflow.AchievedOverSeconds)
		}
		paused := "-"
		if q.PausedUntil != nil {
			paused = q.PausedUntil.UTC().Format(time.RFC3339)
		}
		wait := "-"
		if q.OldestWaitSeconds > 0 {
			wait = (time.Duration(q.OldestWaitSeconds * float64(time.Second))).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%t\n", q.Name, q.Depth, q.InFlight, wait,
			q.Outflow.Configured, achieved, paused, q.Orphaned)
	}
	_ = tw.Flush()
}

// adminClient calls a running sluice's admin API.
type adminClient struct {
	base  *url.URL
	token string
	hc    *http.Client
}

func newAdminClient(c adminClientConfig) (*adminClient, error) {
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: want an http:// or https:// URL", c.url)
	}
	if strings.ContainsAny(c.token, "\r\n") {
		return nil, errors.New("--admin-token must be one line")
	}
	return &adminClient{base: u, token: c.token, hc: &http.Client{Timeout: 60 * time.Second}}, nil
}

// do sends a request with an optional JSON body and decodes a 2xx JSON answer into
// out; any other answer is an error carrying the problem's detail.
func (c *adminClient) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := c.base.JoinPath(path)
	if !strings.HasPrefix(u.Path, "/") { // JoinPath on a base without a path drops it
		u.Path, u.RawPath = "/"+u.Path, ""
	}
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var p struct {
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(data, &p)
		if p.Detail == "" {
			p.Detail = strings.TrimSpace(string(data))
		}
		if resp.StatusCode == http.StatusUnauthorized {
			p.Detail += " (give the token of its --admin-token in --admin-token or SLUICE_ADMIN_TOKEN)"
		}
		return fmt.Errorf("admin API %s %s: %s: %s", method, u.Path, resp.Status, p.Detail)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
