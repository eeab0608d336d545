package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

const queueFlowHelp = `sluice queue flow list QUEUE
sluice queue flow pause QUEUE KEY --for 15m | --until TIME
sluice queue flow resume QUEUE KEY
sluice queue flow rate QUEUE KEY RATE      (RATE like 2/s; "default" removes the pinned rate)

Flow keys are the values of a queue's flow_by source (a merchant's id, say). KEY is
that value; sluice hashes it at once and lists keys by hash only.`

// runQueueFlow runs sluice queue flow ACTION QUEUE [KEY [RATE]] (args after "flow").
func runQueueFlow(ctx context.Context, cfg *queueCmdConfig, args []string, stdout, stderr io.Writer) int {
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice queue flow: "+format+"\n", a...)
		fmt.Fprintln(stderr, queueFlowHelp)
		return exitUsage
	}
	want := map[string]int{"list": 2, "pause": 3, "resume": 3, "rate": 4}
	if len(args) < 1 || want[args[0]] == 0 {
		return usageErr("want an action: list, pause, resume or rate")
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
	switch action {
	case "list":
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
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue flow %s: %v\n", action, err)
		return exitFailure
	}
	if cfg.json {
		_, _ = stdout.Write(raw)
		return exitOK
	}
	var flows []queueapi.FlowView
	if action == "list" {
		var out struct {
			Flows []queueapi.FlowView `json:"flows"`
		}
		err = json.Unmarshal(raw, &out)
		flows = out.Flows
	} else {
		var v queueapi.FlowView
		err = json.Unmarshal(raw, &v)
		flows = []queueapi.FlowView{v}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice queue flow %s: %v\n", action, err)
		return exitFailure
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLOW KEY (HASH)\tPAUSED UNTIL\tPINNED RATE")
	for _, f := range flows {
		paused, rate := "-", "-"
		if f.PausedUntil != nil {
			paused = f.PausedUntil.UTC().Format("2006-01-02T15:04:05Z")
		}
		if f.Rate != "" {
			rate = f.Rate
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.FlowKey, paused, rate)
	}
	_ = tw.Flush()
	return exitOK
}
