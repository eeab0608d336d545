package main

import (
	"context"
	"encoding/json"
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
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice queue flow: "+format+"\n", a...)
		fmt.Fprintln(stderr, queueFlowHelp)
		return exitUsage
	}
	want := map[string]int{"list": 2, "show": 3, "pause": 3, "resume": 3, "rate": 4}
	if len(args) < 1 || want[args[0]] == 0 {
		return usageErr("want an action: list, show, pause, resume or rate")
	}
	action := args[0]
	if len(args) != want[action] {
		return usageErr("%s takes %d arguments", action, want[action]-1)
	}
	name := args[1]
	if !queueconfig.ValidName(name) {
		return usageErr("%q is not a queue name (1 to 64 letters, digits, _ or -)", name)
	}
	var key string
	if len(args) > 2 {
		if key = args[2]; key == "" || key == "." || key == ".." {
			return usageErr("%q cannot name a flow key in a URL", key)
		}
	}
	var rate limiter.Rate
	if action == "rate" && args[3] != "default" {
		var err error
		if rate, err = limiter.ParseRate(args[3]); err != nil {
			return usageErr("rate: %v", err)
		}
	}
	if action == "pause" && (cfg.pause == "") == (cfg.until == "") {
		return usageErr("pause needs --for DURATION or --until TIME (one of them)")
	}
	c, err := newAdminClient(cfg.admin)
	if err != nil {
		return usageErr("%v", err)
	}
	path := "/sluice/v1/queues/" + name + "/flows"
	if key != "" {
		path += "/" + url.PathEscape(key)
	}
	var raw json.RawMessage
	var flows []queueapi.FlowView
	var page queueapi.FlowsPage
	switch action {
	case "list":
		raw, flows, page, err = listFlows(ctx, c, path)
	case "show":
		err = c.do(ctx, http.MethodGet, path, nil, nil, &raw)
	case "pause", "resume":
		err = cfg.pauseOrResume(ctx, c, action, path, &raw)
	case "rate":
		if rate.IsZero() {
			err = c.do(ctx, http.MethodDelete, path+"/rate", nil, nil, &raw)
		} else {
			err = c.do(ctx, http.MethodPut, path+"/rate", nil, map[string]string{"rate": rate.String()}, &raw)
		}
	}
	if err == nil && action != "list" {
		var v queueapi.FlowView
		err = json.Unmarshal(raw, &v)
		flows = []queueapi.FlowView{v}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue flow %s: %v\n", action, err)
		return exitFailure
	}
	if cfg.json {
		_, _ = stdout.Write(raw)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
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
	if action == "list" {
		fmt.Fprintf(stdout, "%d keys; the queue holds %d orders; %d dispatcher reports", len(flows), page.QueueDepth, page.Reports)
		if page.Truncated > 0 {
			fmt.Fprintf(stdout, " (%d keys left out of them)", page.Truncated)
		}
		fmt.Fprintln(stdout)
	}
	return exitOK
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
