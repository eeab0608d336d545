package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/queue"
)

// newCluster makes the console's cluster view: with queues, this replica publishes its
// counters to the NATS bucket every replica reads; without them (sluice rls) the view
// is this process's, kept for the console when there is one.
func (g *gateway) newCluster(reg *prometheus.Registry) error {
	if g.queues == nil && (g.cfg.admin.listen == "" || g.cfg.admin.token == "") {
		return nil
	}
	host, _ := os.Hostname()
	opts := []console.ClusterOption{console.WithClusterLogger(g.log), console.WithHost(host), console.WithInterval(g.cfg.admin.reportEvery)}
	var store interface{ Load() *queue.Store }
	if g.queues != nil {
		store = &g.queues.store
		opts = append(opts, console.WithReportsBucket(g.queues.reportsBucket))
	}
	c, err := console.NewCluster(console.NewReplicaID(), console.LocalReport(reg, store), opts...)
	if err != nil {
		return fmt.Errorf("--console-report-interval: %w", err)
	}
	g.cluster = c
	return nil
}

// openAdmin builds the admin listener, when one is asked for, with the operator
// console under /console/ when there is an admin token to sign in with.
func (g *gateway) openAdmin(reg *prometheus.Registry) error {
	if g.cfg.admin.listen == "" {
		return nil
	}
	g.adminAPI = &ingress.Admin{Gatherer: reg, Rules: g.watcher, Dependencies: g.deps, Token: g.cfg.admin.token}
	opts := []console.Option{console.WithGatherer(reg), console.WithRules(g.watcher), console.WithReloads(&g.reloads),
		console.WithLogger(g.log)}
	if g.cluster != nil {
		opts = append(opts, console.WithCluster(g.cluster))
	}
	if g.cfg.admin.token != "" {
		// One allowance of wrong tokens per address for the API and the console's sign-in.
		g.adminAPI.Guard = ingress.NewTokenGuard(g.cfg.admin.token, nil)
		opts = append(opts, console.WithTokenGuard(g.adminAPI.Guard))
	}
	if g.queues != nil {
		// Unlike NATS trouble, which passes, a server too old for sluice stays until an
		// operator upgrades it: no replica on it can park anything.
		g.adminAPI.Ready = map[string]func(context.Context) error{"nats-version": g.queues.serverVersion}
		g.adminAPI.Queues = &queueapi.API{Store: &g.queues.store, Log: g.log}
		opts = append(opts, console.WithQueueStore(&g.queues.store))
	}
	token, created := g.cfg.admin.token, false
	if token == "" && g.nats != nil && g.nats.embedded != nil {
		// A data directory of this process's own: the console gets a token of its own
		// there (see consoleTokenFile).
		var err error
		if token, created, err = loadConsoleToken(g.cfg.nats.dataDir); err != nil {
			return err
		}
		g.consoleFile = filepath.Join(g.cfg.nats.dataDir, consoleTokenFile)
	}
	if token == "" {
		g.adminAPI.Extra = map[string]http.Handler{"GET " + console.Prefix: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			ingress.WriteProblem(w, http.StatusNotFound, "The console needs an admin token to sign in with: start sluice with --admin-token (or SLUICE_ADMIN_TOKEN).")
		})}
		g.admin = newHTTPServer(g.cfg.admin.listen, g.adminAPI.Handler(), g.log)
		return nil
	}
	c, err := console.New(token, g.adminAPI.Handler(), opts...)
	if err != nil {
		return err
	}
	if created {
		g.consoleCode = c.NewSignInCode()
	}
	g.admin = newHTTPServer(g.cfg.admin.listen, c.Handler(), g.log)
	return nil
}

// logConsole says, once listening, where the console is and how to sign in when its
// token is the one kept in the data directory: the first start prints a one-time
// sign-in URL (Jupyter's way, without putting the token itself in the log), every
// later one the token's file.
func (g *gateway) logConsole() {
	switch {
	case g.consoleFile == "" || g.admin == nil:
	case g.consoleCode != "":
		g.log.Info("console: sign in once at this URL (within "+strings.TrimSuffix(console.SignInCodeTTL.String(), "0m0s")+"; later with the token in the file)",
			"url", consoleURL(g.admin.Addr)+"#code="+g.consoleCode, "file", g.consoleFile)
		g.consoleCode = ""
	default:
		g.log.Info("console: sign in with the token in the file", "url", consoleURL(g.admin.Addr), "file", g.consoleFile)
	}
}
