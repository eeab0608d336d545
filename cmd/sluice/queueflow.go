package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

const queueFlowHelp = `sluice queue flow list QUEUE
sluice queue flow show QUEUE KEY
sluice queue flow pause QUEUE KEY --for 15m | --until TIME
sluice queue flow resume QUEUE KEY
sluice queue flow rate QUEUE KEY RATE      (RATE like 2/s; "default" removes the pinned rate)

Flow keys are the values of a queue's flow_by source (a merchant's id, say). KEY is
that value; sluice hashes it at once and lists keys by hash only. list shows the keys
with settings or orders (all pages), show one key: its pause, pinned and configured
rate, max_in_flight, depth (orders the dispatchers hold) and achieved rate.`

// runQueueFlow runs sluice queue flow ACTION QUEUE [KEY [RATE]] (args after "flow").
func runQueueFlow(ctx context.Context, cfg *queueCmdConfig, args []string, stdout, stderr io.Writer) int {
	usageErr := func(err error) int {
		fmt.Fprintf(stderr, "sluice queue flow: %v\n", err)
		fmt.Fprintln(stderr, queueFlowHelp)
		return exitUsage
	}
	cmd, err := parseFlowCmd(args)
	if err == nil {
		err = cfg.checkPause(cmd.action)
	}
	if err != nil {
		return usageErr(err)
	}
	c, err := newAdminClient(cfg.admin)
	if err != nil {
		return usageErr(err)
	}
	raw, flows, page, err := cfg.flowCall(ctx, c, cmd)
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue flow %s: %v\n", cmd.action, err)
		return exitFailure
	}
	if cfg.json {
		_, _ = stdout.Write(raw)
		return exitOK
	}
	printFlows(stdout, flows)
	if cmd.action == "list" {
		fmt.Fprintf(stdout, "%d keys; the queue holds %d orders; %d dispatcher reports", len(flows), page.QueueDepth, page.Reports)
		if page.Truncated > 0 {
			fmt.Fprintf(stdout, " (%d keys left out of them)", page.Truncated)
		}
		fmt.Fprintln(stdout)
	}
	return exitOK
}

// flowCmd is one sluice queue flow command, its arguments checked.
type flowCmd struct {
	action string
	queue  string
	key    string       // "" for list
	rate   limiter.Rate // for rate: the rate to pin; zero: "default", remove the pinned rate
}

// parseFlowCmd checks the arguments of sluice queue flow (those after "flow"); its
// errors say what is wrong with them.
func parseFlowCmd(args []string) (flowCmd, error) {
	// How many arguments each action takes, its own name included.
	flowArgs := map[string]int{"list": 2, "show": 3, "pause": 3, "resume": 3, "rate": 4}
	if len(args) < 1 || flowArgs[args[0]] == 0 {
		return flowCmd{}, errors.New("want an action: list, show, pause, resume or rate")
	}
	cmd := flowCmd{action: args[0]}
	if want := flowArgs[cmd.action]; len(args) != want {
		return flowCmd{}, fmt.Errorf("%s takes %d arguments", cmd.action, want-1)
	}
	if cmd.queue = args[1]; !queueconfig.ValidName(cmd.queue) {
		return flowCmd{}, fmt.Errorf("%q is not a queue name (1 to 64 letters, digits, _ or -)", cmd.queue)
	}
	if len(args) > 2 {
		if cmd.key = args[2]; cmd.key == "" || cmd.key == "." || cmd.key == ".." {
			return flowCmd{}, fmt.Errorf("%q cannot name a flow key in a URL", cmd.key)
		}
	}
	if cmd.action == "rate" && args[3] != "default" {
		var err error
		if cmd.rate, err = limiter.ParseRate(args[3]); err != nil {
			return flowCmd{}, fmt.Errorf("rate: %w", err)
		}
	}
	return cmd, nil
}

// flowCall makes cmd's call of the admin API: the JSON it answered (one page of
// every key for list, see listFlows), the flows it holds, and for list the last
// page's figures.
func (cfg *queueCmdConfig) flowCall(ctx context.Context, c *adminClient, cmd flowCmd) (json.RawMessage, []queueapi.FlowView, queueapi.FlowsPage, error) {
	path := "/sluice/v1/queues/" + cmd.queue + "/flows"
	if cmd.key != "" {
		path += "/" + url.PathEscape(cmd.key)
	}
	var raw json.RawMessage
	var err error
	switch cmd.action {
	case "list":
		return listFlows(ctx, c, path)
	case "show":
		err = c.do(ctx, http.MethodGet, path, nil, nil, &raw)
	case "pause", "resume":
		err = cfg.pauseOrResume(ctx, c, cmd.action, path, &raw)
	case "rate":
		if cmd.rate.IsZero() {
			err = c.do(ctx, http.MethodDelete, path+"/rate", nil, nil, &raw)
		} else {
			err = c.do(ctx, http.MethodPut, path+"/rate", nil, map[string]string{"rate": cmd.rate.String()}, &raw)
		}
	}
	if err != nil {
		return nil, nil, queueapi.FlowsPage{}, err
	}
	var v queueapi.FlowView
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, nil, queueapi.FlowsPage{}, err
	}
	return raw, []queueapi.FlowView{v}, queueapi.FlowsPage{}, nil
}

// printFlows prints flows as a table, "-" for what a key does not have.
func printFlows(w io.Writer, flows []queueapi.FlowView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLOW KEY (HASH)\tPAUSED UNTIL\tPINNED RATE\tRATE\tMAX IN FLIGHT\tDEPTH\tACHIEVED")
	for _, f := range flows {
		paused, pinned, configured, inFlight, depth, achieved := "-", "-", "-", "-", "-", "-"
		if f.PausedUntil != nil {
			paused = f.PausedUntil.UTC().Format("2006-01-02T15:04:05Z")
		}
		if f.Rate != "" {
			pinned = f.Rate
		}
		if f.ConfiguredRate != "" {
			configured = f.ConfiguredRate
		}
		if f.MaxInFlight > 0 {
			inFlight = strconv.Itoa(f.MaxInFlight)
		}
		if f.Depth != nil {
			depth = strconv.Itoa(*f.Depth)
		}
		if f.AchievedPerSecond != nil {
			achieved = fmt.Sprintf("%.3g/s over %gs", *f.AchievedPerSecond, f.AchievedOverSeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.FlowKey, paused, pinned, configured, inFlight, depth, achieved)
	}
	_ = tw.Flush()
}

// maxFlowPages bounds the pages list follows (the API's largest page each).
const maxFlowPages = 1000

// listFlows reads every page of the flow keys at path: the keys, and the JSON of one
// page holding them all (for --json); page is the last page's figures.
func listFlows(ctx context.Context, c *adminClient, path string) (raw json.RawMessage, flows []queueapi.FlowView, page queueapi.FlowsPage, err error) {
	query := url.Values{"limit": {"1000"}}
	for range maxFlowPages {
		page = queueapi.FlowsPage{}
		if err := c.do(ctx, http.MethodGet, path, query, nil, &page); err != nil {
			return nil, nil, page, err
		}
		flows = append(flows, page.Flows...)
		if page.Next == "" {
			break
		}
		query.Set("after", page.Next)
	}
	all := page
	all.Flows, all.Next = flows, ""
	raw, err = json.Marshal(all)
	return raw, flows, page, err
}
