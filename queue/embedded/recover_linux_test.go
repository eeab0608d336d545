package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/natstest/fulldisk"
)

// A stream that met a full disk answers again once the disk has room, without a
// restart of the process: the server restarts JetStream, and what was stored before
// is all there. Unless a stream of the directory no longer opens: then JetStream stays
// off, and the stream's files stay as they were.
func TestJetStreamRecoversFromAFullDisk(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "recovers", true: "a stream no longer opens"}[broken], func(t *testing.T) {
			disk := fulldisk.Mount(t, 32<<20)
			dir := filepath.Join(disk, "data")
			logFile, err := os.Create(filepath.Join(t.TempDir(), "log")) // written by the server, read by the test
			if err != nil {
				t.Fatal(err)
			}
			defer logFile.Close()
			logged := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
			e, err := embedded.Start(embedded.Config{DataDir: dir, RecoveryLogger: slog.New(slog.NewTextHandler(logFile, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Shutdown()
			nc, err := e.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			publish := func(subject string, i int) error {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := js.Publish(pctx, subject, append(fmt.Appendf(nil, "%d:", i), make([]byte, 4096)...))
				return err
			}
			for _, name := range []string{"S", "T"} {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name)}, Storage: jetstream.FileStorage}); err != nil {
					t.Fatal(err)
				}
			}
			const before = 10
			for i := range before {
				if err := publish("s", i); err != nil {
					t.Fatal(err)
				}
			}

			ballast := fulldisk.Fill(t, disk, 0)
			failed := false
			for i := 0; i < 20 && !failed; i++ {
				failed = publish("s", before+i) != nil
			}
			if !failed {
				t.Fatal("every publish stored on a full disk")
			}
			if err := publish("s", -1); err == nil {
				t.Fatal("a publish stored after one failed on the full disk, before the space is freed")
			}
			meta := filepath.Join(dir, "jetstream", "$G", "streams", "T", "meta.inf")
			if broken {
				if err := os.Truncate(meta, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Remove(ballast); err != nil {
				t.Fatal(err)
			}

			if broken {
				waitUntil(t, "a refused restart logged", func() bool { return strings.Contains(logged(), "JetStream not restarted") })
				if e.NATS().JetStreamEnabled() {
					t.Error("JetStream is on with a stream of the directory not opened")
				}
				if st, err := os.Stat(meta); err != nil || st.Size() != 0 {
					t.Errorf("the stream that did not open was changed: %v %v", st, err)
				}
				if err := publish("s", -1); err == nil {
					t.Error("a publish stored with JetStream off")
				}
				return
			}
			waitUntil(t, "a publish stored again", func() bool { return publish("s", -1) == nil })
			if !strings.Contains(logged(), "a write to the store failed") {
				t.Errorf("the write error not logged:\n%s", logged())
			}
			if !strings.Contains(logged(), "JetStream restarted") {
				t.Errorf("no restart logged:\n%s", logged())
			}
			s, err := js.Stream(ctx, "S")
			if err != nil {
				t.Fatal(err)
			}
			for i := range before {
				m, err := s.GetMsg(ctx, uint64(i+1))
				if err != nil || !bytes.HasPrefix(m.Data, fmt.Appendf(nil, "%d:", i)) {
					t.Fatalf("message %d after the restart: %v", i+1, err)
				}
			}
			if _, err := js.Stream(ctx, "T"); err != nil {
				t.Errorf("stream T after the restart: %v", err)
			}
		})
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
