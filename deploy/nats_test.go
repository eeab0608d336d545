package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/rules"
)

// sluiceNATSUser is the user of deploy/nats/accounts.conf that sluice connects as.
const sluiceNATSUser = "sluice"

// checkNATSAuth checks that a NATS server configuration of the shapes lets nobody in
// without credentials: clients are users with passwords and no no_auth_user, routes
// authenticate, and there is no other listener (leaf nodes, gateways, WebSocket,
// MQTT: each would need its own authorization). Every password must be one of
// secrets, the values the test put in the environment: a password written in a file
// is none of them. It returns the users by name.
func checkNATSAuth(t *testing.T, where string, opts *server.Options, secrets []string) map[string]*server.User {
	t.Helper()
	if opts.NoAuthUser != "" {
		t.Errorf("%s: no_auth_user %s: a client without credentials gets in as that user", where, opts.NoAuthUser)
	}
	if len(opts.Users) == 0 {
		t.Errorf("%s: no users: the server admits any client", where)
	}
	if opts.Authorization != "" && !slices.Contains(secrets, opts.Authorization) {
		t.Errorf("%s: a token that is not from the environment", where)
	}
	if opts.Username != "" && !slices.Contains(secrets, opts.Password) {
		t.Errorf("%s: user %s has a password that is not from the environment", where, opts.Username)
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		if !slices.Contains(secrets, u.Password) {
			// Never print it: it may be a real one.
			t.Errorf("%s: user %s has a password that is not from the environment (written in the file, or empty)", where, u.Username)
		}
		users[u.Username] = u
	}
	for name, port := range map[string]int{"leafnodes": opts.LeafNode.Port, "gateway": opts.Gateway.Port, "websocket": opts.Websocket.Port, "mqtt": opts.MQTT.Port} {
		if port != 0 {
			t.Errorf("%s: a %s listener: give it an authorization of its own and check it here", where, name)
		}
	}
	if opts.Cluster.Port != 0 {
		// A route sees every account's messages: an open cluster port is an open server.
		if opts.Cluster.Username == "" || !slices.Contains(secrets, opts.Cluster.Password) {
			t.Errorf("%s: cluster routes without a password from the environment: whoever reaches port %d joins the cluster", where, opts.Cluster.Port)
		}
		for _, r := range opts.Routes {
			if opts.Cluster.Username == "" {
				break
			}
			var user, pw string
			if r.User != nil {
				user = r.User.Username()
				pw, _ = r.User.Password()
			}
			if user != opts.Cluster.Username || pw != opts.Cluster.Password {
				t.Errorf("%s: route %s does not carry the cluster's credentials: the other node refuses it", where, r.Host)
			}
		}
	}
	return users
}

// natsNotDurable says why a NATS server with opts may acknowledge a JetStream write
// that is not on its disk yet, or "" when it syncs every write first
// (sync_interval: always). Under nats-server's default, a flush every two minutes, a
// power cut of the whole cluster (or one node's OS crash while another is paused or
// cut off) loses orders that sluice answered 202 for.
func natsNotDurable(opts *server.Options) string {
	if !opts.JetStream || opts.SyncAlways {
		return ""
	}
	every := opts.SyncInterval
	if every == 0 {
		every = 2 * time.Minute // nats-server's defaultSyncInterval
	}
	return fmt.Sprintf("JetStream acknowledges writes before they are on disk (a sync every %s): set sync_interval: always in its jetstream block", every)
}

// checkNATSClient checks that a sluice connects to NATS as the user sluice of the
// servers' configuration: every --nats URL carries that user and its password (the
// client sends each URL's own credentials to its server), given in the environment,
// not on the command line, which ps shows. It returns the user (nil if missing).
func checkNATSClient(t *testing.T, where string, g gatewayConfig, users map[string]*server.User) *server.User {
	t.Helper()
	user := users[sluiceNATSUser]
	if user == nil {
		t.Errorf("%s: the NATS servers have no user %s (deploy/nats/accounts.conf)", where, sluiceNATSUser)
		return nil
	}
	if _, ok := g.flags["nats"]; ok {
		t.Errorf("%s: --nats on the command line: its password would show in ps; give SLUICE_NATS", where)
	}
	urls := g.list("nats")
	if len(urls) == 0 {
		t.Errorf("%s: no --nats", where)
	}
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			t.Errorf("%s: --nats: a URL does not parse", where) // the error would quote the password
			continue
		}
		pw, _ := u.User.Password()
		switch {
		case u.User == nil:
			t.Errorf("%s: --nats %s carries no credentials: the servers refuse it", where, u.Host)
		case u.User.Username() != sluiceNATSUser:
			t.Errorf("%s: --nats %s: user %s, want %s (its permissions are those sluice needs)", where, u.Host, u.User.Username(), sluiceNATSUser)
		case pw != user.Password:
			t.Errorf("%s: --nats %s: the password is not the one the servers have for %s", where, u.Host, sluiceNATSUser)
		}
	}
	return user
}

// checkNATSDownstreams checks that the user sluice may publish on the subject of
// every nats:SUBJECT downstream of set: the server refuses a publish outside its
// permissions, so such a queue would never deliver.
func checkNATSDownstreams(t *testing.T, where string, user *server.User, set *rules.Set) {
	t.Helper()
	for _, q := range set.Queues() {
		if subj := q.NATSSubject(); subj != "" && !mayPublish(user, subj) {
			t.Errorf("%s: queue %s delivers to %s, which the NATS user %s may not publish on (deploy/nats/accounts.conf)", where, q.Name, subj, user.Username)
		}
	}
}

func mayPublish(u *server.User, subject string) bool {
	if u.Permissions == nil || u.Permissions.Publish == nil {
		return true
	}
	p := u.Permissions.Publish
	match := func(filter string) bool { return server.SubjectMatchesFilter(subject, filter) }
	return (len(p.Allow) == 0 || slices.ContainsFunc(p.Allow, match)) && !slices.ContainsFunc(p.Deny, match)
}

// TestComposeNATSCluster starts the three NATS nodes of compose in process, each
// from compose's nats.conf with the files its container mounts (accounts.conf
// included) and the environment compose gives it, on loopback ports instead of the
// compose network's. It checks that the nodes' routes authenticate each other (an R3
// stream is placed), that the NATS URLs compose gives sluice connect as the user
// sluice, that clients and routes without the credentials, or with wrong ones, are
// refused, and that the unauthenticated monitoring endpoints show no password.
func TestComposeNATSCluster(t *testing.T) {
	c := loadCompose(t)
	var nodes []string
	for name, s := range c.Services {
		if repo, _ := splitImage(s.Image); repo == "nats" {
			nodes = append(nodes, name)
		}
	}
	slices.Sort(nodes)
	if len(nodes) != 3 {
		t.Fatalf("want 3 NATS nodes, got %v", nodes)
	}
	// The routes name the nodes' cluster ports, so those are chosen before any starts.
	clusterPort := map[string]int{}
	var held []net.Listener
	for _, n := range nodes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		clusterPort[n] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range held {
		l.Close()
	}
	clientAddr := map[string]string{}
	var servers []*natstest.Server
	for _, n := range nodes {
		s := c.Services[n]
		cfg := ""
		for i, a := range s.Command {
			if a == "--config" && i+1 < len(s.Command) {
				cfg = s.Command[i+1]
			}
		}
		for k, v := range s.Environment {
			t.Setenv(k, v)
		}
		srv := natstest.StartConfig(t, s.mountInto(t, cfg), func(o *server.Options) {
			o.Cluster.Host, o.Cluster.Port = "127.0.0.1", clusterPort[n]
			var routes []*url.URL
			for _, r := range o.Routes {
				p, ok := clusterPort[r.Hostname()]
				if !ok {
					t.Fatalf("compose %s: a route to %s, no node of compose", n, r.Host)
				}
				moved := *r // the credentials stay
				moved.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
				routes = append(routes, &moved)
			}
			o.Routes = routes
		})
		clientAddr[n] = strings.TrimPrefix(srv.URL, "nats://")
		servers = append(servers, srv)
	}

	// sluice's URLs, as compose gives them, pointed at the nodes here.
	var sluiceURLs []string
	for name, s := range c.Services {
		if v, ok := s.Environment["SLUICE_NATS"]; ok && sluiceURLs == nil {
			for _, raw := range strings.Split(v, ",") {
				u, err := url.Parse(raw)
				if err != nil || clientAddr[u.Hostname()] == "" {
					t.Fatalf("compose %s: SLUICE_NATS: a URL that names no NATS node", name)
				}
				u.Host = clientAddr[u.Hostname()]
				sluiceURLs = append(sluiceURLs, u.String())
			}
		}
	}
	if sluiceURLs == nil {
		t.Fatal("compose: no service has SLUICE_NATS")
	}
	nc, err := nats.Connect(strings.Join(sluiceURLs, ","), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("sluice's URLs of compose: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// An R3 stream is placed only once the three nodes have routed to each other,
	// which they do only with the route credentials.
	cfg := jetstream.StreamConfig{Name: "SLUICE_Q_deploytest", Subjects: []string{"sluice.q.deploytest.>"}, Replicas: 3, Storage: jetstream.FileStorage}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.CreateStream(ctx, cfg)
		if err == nil {
			_, err = js.Publish(ctx, "sluice.q.deploytest.x", []byte("order"))
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no R3 stream on compose's NATS cluster as user sluice: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}

	checkStreamsJob(t, c, clientAddr)

	// The monitoring port has no authentication (health checks use it): what it
	// shows must hold no password (route URLs, users, connections).
	for i, srv := range servers {
		varz, err := srv.Server().Varz(nil)
		if err != nil {
			t.Fatal(err)
		}
		connz, err := srv.Server().Connz(&server.ConnzOptions{Username: true, Subscriptions: true})
		if err != nil {
			t.Fatal(err)
		}
		routez, err := srv.Server().Routez(&server.RoutezOptions{Subscriptions: true})
		if err != nil {
			t.Fatal(err)
		}
		shown, err := json.Marshal([]any{varz, connz, routez})
		if err != nil {
			t.Fatal(err)
		}
		for name, secret := range composeEnv {
			if strings.Contains(string(shown), secret) {
				t.Errorf("%s: the monitoring endpoints show $%s", nodes[i], name)
			}
		}
	}

	refused := func(err error) bool {
		return err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization violation")
	}
	pw := composeEnv["NATS_SLUICE_PASSWORD"]
	for _, n := range nodes {
		for what, opts := range map[string][]nats.Option{
			"without credentials":   nil,
			"with a wrong password": {nats.UserInfo(sluiceNATSUser, pw[:len(pw)-1]+"x")},
			"as the route user":     {nats.UserInfo("route", composeEnv["NATS_ROUTE_PASSWORD"])},
		} {
			nc, err := nats.Connect("nats://"+clientAddr[n], append(opts, nats.Timeout(10*time.Second))...)
			if err == nil {
				nc.Close()
			}
			if !refused(err) {
				t.Errorf("%s: a client %s: %v, want an authorization violation", n, what, err)
			}
		}
		for what, creds := range map[string][2]string{
			"without credentials":   {},
			"with a wrong password": {"route", "not-the-password"},
			"as the user sluice":    {sluiceNATSUser, pw},
		} {
			if got := routeConnect(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(clusterPort[n])), creds[0], creds[1]); !strings.Contains(got, "Authorization Violation") {
				t.Errorf("%s: a route %s: the server answered %q, want an authorization violation", n, what, got)
			}
		}
	}
}

// routeConnect connects to a cluster port as a server would (INFO, then CONNECT
// with the credentials) and returns the server's answer to the CONNECT and a PING:
// an -ERR line, a PONG, or how the connection ended.
func routeConnect(t *testing.T, addr, user, pass string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("%s: want INFO, got %q (%v)", addr, line, err)
	}
	connect := map[string]any{"verbose": false, "pedantic": false, "tls_required": false, "name": "NROGUE", "cluster": "sluice", "headers": true}
	if user != "" {
		connect["user"], connect["pass"] = user, pass
	}
	b, err := json.Marshal(connect)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", b); err != nil {
		return "write: " + err.Error()
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "closed: " + err.Error()
		}
		if strings.HasPrefix(line, "-ERR") || strings.HasPrefix(line, "PONG") {
			return strings.TrimSpace(line)
		}
	}
}

// TestNATSNotDurable checks the check the deploy tests run on every NATS
// configuration they parse: a jetstream block without sync_interval (nats-server's
// lazy default) or with an interval fails it; sync_interval: always passes.
func TestNATSNotDurable(t *testing.T) {
	for conf, wantDurable := range map[string]bool{
		"jetstream { store_dir: %q }":                                false,
		"jetstream { store_dir: %q, sync_interval: 10s }":            false,
		"jetstream { store_dir: %q, sync_interval: always }":         true,
		"jetstream { store_dir: %q, sync: ALWAYS }":                  true,
		"jetstream { store_dir: %q }\nserver_name: a // no sync set": false,
	} {
		path := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(conf, t.TempDir())), 0o600); err != nil {
			t.Fatal(err)
		}
		why := natsNotDurable(loadNATSConfig(t, path, nil))
		if (why == "") != wantDurable {
			t.Errorf("%q: natsNotDurable = %q, want durable %v", conf, why, wantDurable)
		}
	}
}

// streamAdd is how the nats-streams job's command makes a stream: name, subjects
// (quoted) and replicas.
var streamAdd = regexp.MustCompile(`nats stream add (\S+) --subjects '([^']+)'.* --replicas (\d+)`)

// checkStreamsJob runs what compose's nats-streams job does against the nodes (client
// addresses by service name): it connects with the server URLs and credentials its
// environment gives the nats CLI (NATS_URL, NATS_USER, NATS_PASSWORD) and makes the
// stream its command names. The shipped job once had no credentials, so every node
// refused it. It also checks that no service waits for the job: a one-shot job that
// fails would hold them back for ever.
func checkStreamsJob(t *testing.T, c composeFile, clientAddr map[string]string) {
	t.Helper()
	const job = "nats-streams"
	s, ok := c.Services[job]
	if !ok {
		t.Errorf("compose: no %s job", job)
		return
	}
	for name, other := range c.Services {
		if slices.Contains(other.DependsOn, job) {
			t.Errorf("compose %s waits for the job %s: if it fails, %s never starts", name, job, name)
		}
	}
	m := streamAdd.FindStringSubmatch(strings.Join(s.Command, " "))
	if m == nil {
		t.Fatalf("compose %s: no `nats stream add NAME --subjects '…' … --replicas N` in %q", job, s.Command)
	}
	replicas, _ := strconv.Atoi(m[3])
	var urls []string
	for _, raw := range strings.Split(s.Environment["NATS_URL"], ",") {
		u, err := url.Parse(raw)
		if err != nil || clientAddr[u.Hostname()] == "" {
			t.Fatalf("compose %s: NATS_URL %q names no NATS node", job, raw)
		}
		urls = append(urls, "nats://"+clientAddr[u.Hostname()])
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.UserInfo(s.Environment["NATS_USER"], s.Environment["NATS_PASSWORD"]), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("compose %s: connect as NATS_USER %q: %v", job, s.Environment["NATS_USER"], err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: m[1], Subjects: []string{m[2]}, Replicas: replicas, Storage: jetstream.FileStorage}); err != nil {
		t.Errorf("compose %s: stream add %s as %s: %v", job, m[1], s.Environment["NATS_USER"], err)
	}
}
