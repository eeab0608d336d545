package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a collector reduced to what the test needs: it accepts OTLP/HTTP
// protobuf exports at /v1/traces and keeps their spans.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	bad   []string // what it could not decode
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
			http.NotFound(w, req)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var export collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &export)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.bad = append(r.bad, err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range export.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// span returns the first span named name whose attribute key is value.
func (r *otlpReceiver) span(name, key, value string) *tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.GetName() == name && spanAttr(s, key) == value {
			return s
		}
	}
	return nil
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10)
		}
	}
	return ""
}

// A deferred order through `sluice serve` with OTEL_EXPORTER_OTLP_ENDPOINT set: the
// decision, park and delivery spans reach the OTLP receiver; the decision continues
// the client's trace, the park is its child, and the delivery, in a trace of its own,
// links to the park and is what the downstream's traceparent names.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	t.Parallel()
	recv := newOTLPReceiver(t)
	var mu sync.Mutex
	var gotTraceparent string
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gotTraceparent = r.Header.Get("Traceparent")
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(down.Close)
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL,
		"OTEL_BSP_SCHEDULE_DELAY=50", // export within 50ms rather than 5s
		"OTEL_SERVICE_NAME=sluice-e2e",
		"OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_EXPORTER_OTLP_PROTOCOL=", // whatever the test's own environment says
	}
	p := startBinaryEnv(t, sluiceBinary, env, "serve", append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	a := mustDefer(t, p.url, "/v1/orders", "traced", "Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)

	var decide, park, deliver *tracepb.Span
	deadline := time.Now().Add(30 * time.Second)
	for {
		decide = recv.span("sluice.decide", "sluice.outcome", "deferred")
		park = recv.span("sluice.park", "sluice.ticket", a.Ticket)
		deliver = recv.span("sluice.deliver", "sluice.ticket", a.Ticket)
		if decide != nil && park != nil && deliver != nil {
			break
		}
		if time.Now().After(deadline) {
			recv.mu.Lock()
			t.Fatalf("spans missing (decide %v, park %v, deliver %v); received %d, undecodable %v",
				decide != nil, park != nil, deliver != nil, len(recv.spans), recv.bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
	hexID := func(b []byte) string { return hex.EncodeToString(b) }
	if got := hexID(decide.GetTraceId()); got != clientTrace {
		t.Errorf("decision span in trace %s, want the client's %s", got, clientTrace)
	}
	if spanAttr(decide, "sluice.rule") != "orders" || spanAttr(decide, "sluice.route") != "orders" {
		t.Errorf("decision span attributes %v", decide.GetAttributes())
	}
	if !bytes.Equal(park.GetParentSpanId(), decide.GetSpanId()) || !bytes.Equal(park.GetTraceId(), decide.GetTraceId()) {
		t.Errorf("park span's parent %s, want the decision span %s", hexID(park.GetParentSpanId()), hexID(decide.GetSpanId()))
	}
	if spanAttr(park, "sluice.queue") != "orders" {
		t.Errorf("park span attributes %v", park.GetAttributes())
	}
	if len(deliver.GetParentSpanId()) != 0 || bytes.Equal(deliver.GetTraceId(), decide.GetTraceId()) {
		t.Errorf("delivery span: parent %s in trace %s; want the root of a trace of its own", hexID(deliver.GetParentSpanId()), hexID(deliver.GetTraceId()))
	}
	links := deliver.GetLinks()
	if len(links) != 1 || !bytes.Equal(links[0].GetTraceId(), park.GetTraceId()) || !bytes.Equal(links[0].GetSpanId(), park.GetSpanId()) {
		t.Errorf("delivery span links %v, want one to the park span %s/%s", links, hexID(park.GetTraceId()), hexID(park.GetSpanId()))
	}
	if spanAttr(deliver, "sluice.queue") != "orders" || spanAttr(deliver, "sluice.attempt") != "1" ||
		spanAttr(deliver, "http.response.status_code") != "201" {
		t.Errorf("delivery span attributes %v", deliver.GetAttributes())
	}
	// The delivery histogram names the delivery's trace in an exemplar (OpenMetrics).
	req, _ := http.NewRequest("GET", p.admin+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	exemplar := `trace_id="` + hexID(deliver.GetTraceId()) + `"`
	if !bytes.Contains(metrics, []byte(exemplar)) {
		t.Errorf("/metrics (OpenMetrics) has no exemplar %s", exemplar)
	}
	mu.Lock()
	tp := gotTraceparent
	mu.Unlock()
	if want := "00-" + hexID(deliver.GetTraceId()) + "-" + hexID(deliver.GetSpanId()) + "-01"; tp != want {
		t.Errorf("downstream got traceparent %q, want the delivery span's %q", tp, want)
	}
}
