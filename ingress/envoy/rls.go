package envoy

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Limits on one RateLimitRequest: more is refused as InvalidArgument.
const (
	MaxDescriptors = 64
	// MaxHits is the largest hits_addend (the limiter's numbers are exact below 2^53).
	MaxHits = 1 << 52
)

// RateLimitService implements envoy.service.ratelimit.v3.RateLimitService. Create it
// with NewRateLimitService.
type RateLimitService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rules   ingress.RulesSource
	limiter limiter.Limiter
	engine  *decide.Engine
	reg     prometheus.Registerer
	shadow  bool
	headers bool
	dynMeta bool
	log     *slog.Logger
}

// Option configures a RateLimitService.
type Option func(*RateLimitService)

// WithShadow puts every rule in shadow mode, as Envoy's SHADOW_MODE: descriptors over
// their limit keep the status OVER_LIMIT, the overall code is OK.
func WithShadow(on bool) Option { return func(s *RateLimitService) { s.shadow = on } }

// WithResponseHeaders turns response_headers_to_add on or off (default on):
// X-Ratelimit-Limit, X-Ratelimit-Remaining, RateLimit-Policy and RateLimit for the
// descriptor closest to running out, and Retry-After / X-Ratelimit-Retry-After when
// the request is over the limit.
func WithResponseHeaders(on bool) Option { return func(s *RateLimitService) { s.headers = on } }

// WithDynamicMetadata turns dynamic_metadata on or off (default off), as Envoy's
// RESPONSE_DYNAMIC_METADATA: the response then carries the request's domain, its
// descriptors (each as "entries", a list of "key=value", with its "limit" override
// and "hitsAddend" when it has them), the request's "hitsAddend" when not 0, and
// "metadata": the `metadata` of the rules of every descriptor whose status is OK,
// merged in the order of the descriptors (a key already set keeps its first value;
// mappings under one key are merged the same way). With quota_mode this names the
// quotas that still have room, which Envoy's route can read
// (%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:…)%) to pick an upstream.
// The descriptors' values go back to the proxy that sent them, nowhere else.
func WithDynamicMetadata(on bool) Option { return func(s *RateLimitService) { s.dynMeta = on } }

// WithRegisterer counts decisions in the front door's series on reg
// (sluice_decisions_total{rule,outcome}, sluice_decision_duration_seconds).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(s *RateLimitService) { s.reg = reg }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *RateLimitService) { s.log = l } }

// NewRateLimitService returns a service deciding with lim on the rules src provides.
// It fails when src or lim is nil, WithLogger was given nil, or the metrics cannot be
// registered.
func NewRateLimitService(src ingress.RulesSource, lim limiter.Limiter, opts ...Option) (*RateLimitService, error) {
	if src == nil || lim == nil {
		return nil, errors.New("envoy: NewRateLimitService needs a rules source and a limiter")
	}
	s := &RateLimitService{rules: src, limiter: lim, headers: true, log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		return nil, errors.New("envoy: WithLogger(nil)")
	}
	var err error
	if s.engine, err = decide.New(lim, decide.WithShadow(s.shadow), decide.WithLogger(s.log), decide.WithRegisterer(s.reg)); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	return s, nil
}

// ShouldRateLimit implements the rate limit service. Each descriptor is looked up in
// the domain (rules.Set.Evaluate) and charged its hits_addend (the descriptor's, else
// the request's, at least 1) under every limit of the rule it reaches; a descriptor
// with a `limit` override is charged under that limit instead (a fixed window of the
// override's unit, keyed by the domain and every entry of the descriptor), as Envoy's
// service does, provided the domain exists. A descriptor that reaches no rule is OK
// without a current_limit.
//
// The overall code is OVER_LIMIT when a descriptor of a rule without quota mode is
// over its limit, or when the request reached quota-mode rules (rules.Rule.Quota,
// Envoy's quota_mode) and every one is over its limit; a quota-mode descriptor over
// its limit keeps its status OVER_LIMIT (limit_remaining 0) whatever the overall code,
// which is how an exhausted quota is reported. A descriptor with a `limit` override is
// never in quota mode, as in Envoy's service. The descriptors are decided by the
// front door's engine (package ingress/decide), with the hits as their cost and every
// rule rejecting: a defer or wait rule over its limit is OVER_LIMIT. A request refused
// as InvalidArgument charges nothing.
func (s *RateLimitService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	set := s.rules.Set()
	s.engine.Use(set)
	c, slots := newCall(len(req.Descriptors))
	found := c.lookup(set, req)
	// The checks to charge, their hits and their results: on the stack for up to
	// four.
	var (
		fewChecks  [4]rules.Check
		fewHits    [4]int64
		fewResults [4]decide.Result
	)
	todo, results := fewChecks[:0], fewResults[:]
	if n := len(req.Descriptors); n > len(fewChecks) {
		todo, results = make([]rules.Check, 0, n), make([]decide.Result, n)
	}
	todo, hits, err := charges(set, req, found, slots, todo, fewHits[:])
	if err != nil {
		return nil, err
	}
	results = results[:len(todo)]
	v := s.engine.Decide(ctx, &decide.Request{Checks: todo, Hits: hits, RejectOnly: true, Results: results})
	meta := s.setStatuses(&c.resp, slots, todo, results)
	s.conclude(&c.resp, req, &v, meta)
	return &c.resp, nil
}

// newCall returns the call of a request of n descriptors, its overall code OK, and
// the slots of the descriptors' statuses. One allocation holds the response, the
// messages it points to and the lookup's scratch when there is one descriptor, the
// usual case.
func newCall(n int) (*call, []statusSlot) {
	c := new(call)
	c.resp.OverallCode, c.resp.Statuses = rlsv3.RateLimitResponse_OK, c.statuses[:]
	slots := c.slots[:]
	if n > 1 {
		c.resp.Statuses, slots = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n), make([]statusSlot, n)
	}
	return c, slots
}

// lookup returns the checks of the rules that req's descriptors reach in its domain,
// in the order of the descriptors (see rules.Set.Evaluate).
func (c *call) lookup(set *rules.Set, req *rlsv3.RateLimitRequest) []rules.Check {
	entries, descs, checks := c.entries[:0], c.descs[:], c.checks[:0]
	if n := len(req.Descriptors); n > 1 {
		entries, descs, checks = make([]rules.Entry, 0, 2*n), make([][]rules.Entry, n), make([]rules.Check, 0, n)
	}
	for i, d := range req.Descriptors {
		from := len(entries)
		for _, e := range d.Entries {
			entries = append(entries, rules.Entry{Key: e.Key, Value: e.Value})
		}
		descs[i] = entries[from:len(entries):len(entries)]
	}
	return set.Evaluate(req.Domain, descs, checks)
}

// charges appends to todo the checks to charge for req's descriptors, given those
// the lookup found, and sets each descriptor's slot to the index of its check among
// them (-1: none). Every check is known before the first is charged: a request
// refused as invalid (an InvalidArgument error) charges nothing. The hits are nil
// when every check costs 1; otherwise each check's, in spare when they fit.
func charges(set *rules.Set, req *rlsv3.RateLimitRequest, found []rules.Check, slots []statusSlot, todo []rules.Check, spare []int64) ([]rules.Check, []int64, error) {
	var hits []int64
	for i, d := range req.Descriptors {
		slots[i].at = -1
		var ck *rules.Check
		if len(found) > 0 && found[0].Descriptor == i {
			ck, found = &found[0], found[1:]
		}
		ck, err := chargedCheck(set, req.Domain, d, ck)
		if err != nil {
			return nil, nil, status.Error(codes.InvalidArgument, fmt.Sprintf("descriptor %d: %v", i, err))
		}
		if ck == nil {
			continue
		}
		if h := hitsOf(req, d); h != 1 || hits != nil {
			if hits == nil { // the checks before this one cost 1
				if hits = spare; len(req.Descriptors) > len(spare) {
					hits = make([]int64, len(req.Descriptors))
				}
				for j := range todo {
					hits[j] = 1
				}
			}
			hits[len(todo)] = h
		}
		slots[i].at = len(todo)
		todo = append(todo, *ck)
	}
	if hits != nil {
		hits = hits[:len(todo)]
	}
	return todo, hits, nil
}

// chargedCheck is the check to charge for descriptor d of domain, given the check
// of the rule it reached (matched, nil for none): that of its `limit` override when
// it has one and the domain exists (see overrideCheck), else matched. It is nil when
// nothing is charged: no rule, an unlimited one, or a refund (negative hits), which
// sluice's limiter cannot give back.
func chargedCheck(set *rules.Set, domain string, d *rlcommon.RateLimitDescriptor, matched *rules.Check) (*rules.Check, error) {
	ck := matched
	if o := d.GetLimit(); o != nil {
		if !slices.Contains(set.Domains(), domain) {
			return nil, nil
		}
		var err error
		if ck, err = overrideCheck(domain, d, o, matched); err != nil {
			return nil, err
		}
	}
	if ck == nil || ck.Rule.Unlimited || d.GetIsNegativeHits() {
		return nil, nil
	}
	return ck, nil
}

// setStatuses sets each descriptor's status in resp from the result of its check
// (todo[slots[i].at], results alike) and returns the metadata of the rules whose
// descriptors are OK, merged (see WithDynamicMetadata; nil when it is off or none).
func (s *RateLimitService) setStatuses(resp *rlsv3.RateLimitResponse, slots []statusSlot, todo []rules.Check, results []decide.Result) *structpb.Struct {
	var meta *structpb.Struct
	for i := range resp.Statuses {
		j := slots[i].at
		if j < 0 {
			resp.Statuses[i] = slots[i].ok()
			continue
		}
		rule, res := todo[j].Rule, &results[j]
		st := slots[i].status(rule, res.Decision)
		if res.Outcome == decide.OutcomeShadowDenied && rule.Shadow {
			// Envoy's descriptor shadow_mode: the descriptor is OK. (A quota
			// descriptor exhausted stays OVER_LIMIT whatever the overall code.)
			st.Code = rlsv3.RateLimitResponse_OK
		}
		if s.dynMeta && rule.Metadata != nil && st.Code == rlsv3.RateLimitResponse_OK {
			meta = s.mergeMetadata(meta, rule)
		}
		resp.Statuses[i] = st
	}
	return meta
}

// conclude sets resp's overall code from v, its response headers (with
// WithResponseHeaders) and its dynamic metadata, meta the passed rules' (with
// WithDynamicMetadata).
func (s *RateLimitService) conclude(resp *rlsv3.RateLimitResponse, req *rlsv3.RateLimitRequest, v *decide.Verdict, meta *structpb.Struct) {
	if v.Violated != nil {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.headers && (v.ClosestRule != nil || v.Violated != nil) {
		// A block-list rule has no limit to describe (empty fields), but a
		// Retry-After, as on the front door.
		var wait string
		if v.Violated != nil {
			wait = strconv.FormatInt(decide.RetryAfterSeconds(v.RetryAfter), 10)
		}
		resp.ResponseHeadersToAdd = rateLimitHeaders(v.Fields(), wait)
	}
	if s.dynMeta {
		resp.DynamicMetadata = dynamicMetadata(req, meta)
	}
}

// mergeMetadata merges the metadata of rule into into (nil: none yet) and returns
// it. A key into has keeps its value, except that two mappings are merged.
func (s *RateLimitService) mergeMetadata(into *structpb.Struct, rule *rules.Rule) *structpb.Struct {
	// A fresh copy: rule.Metadata is shared, and merging writes into what it gave.
	m, err := structpb.NewStruct(rule.Metadata)
	if err != nil { // the rules parser admits only what structpb takes
		s.log.Error("rule metadata", "rule", rule.Name, "err", err)
		return into
	}
	if into == nil {
		return m
	}
	mergeStruct(into, m)
	return into
}

func mergeStruct(into, from *structpb.Struct) {
	for k, v := range from.GetFields() {
		have, ok := into.Fields[k]
		if !ok {
			into.Fields[k] = v
			continue
		}
		if hs, fs := have.GetStructValue(), v.GetStructValue(); hs != nil && fs != nil {
			mergeStruct(hs, fs)
		}
	}
}

// dynamicMetadata is the dynamic_metadata of a response to req (see
// WithDynamicMetadata).
func dynamicMetadata(req *rlsv3.RateLimitRequest, meta *structpb.Struct) *structpb.Struct {
	descs := make([]*structpb.Value, len(req.Descriptors))
	for i, d := range req.Descriptors {
		entries := make([]*structpb.Value, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if o := d.GetLimit(); o != nil {
			f["limit"] = structpb.NewStringValue(prototext.Format(o))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.Value))
		}
		descs[i] = structpb.NewStructValue(&structpb.Struct{Fields: f})
	}
	out := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.HitsAddend != 0 {
		out["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if len(meta.GetFields()) > 0 {
		out["metadata"] = structpb.NewStructValue(meta)
	}
	return &structpb.Struct{Fields: out}
}

func validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.GetDomain() == "":
		return errors.New("domain must not be empty")
	case len(req.GetDescriptors()) == 0:
		return errors.New("descriptors must not be empty")
	case len(req.Descriptors) > MaxDescriptors:
		return fmt.Errorf("%d descriptors: at most %d", len(req.Descriptors), MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if len(d.GetEntries()) == 0 {
			return fmt.Errorf("descriptor %d has no entries", i)
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > MaxHits {
			return fmt.Errorf("descriptor %d: hits_addend %d: at most %d", i, h.Value, int64(MaxHits))
		}
	}
	return nil
}

// hitsOf is what descriptor d costs: its own hits_addend, else the request's, and at
// least 1 (a check always costs something: the limiter cannot peek).
func hitsOf(req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor) int64 {
	n := int64(req.HitsAddend)
	if h := d.GetHitsAddend(); h != nil {
		n = int64(h.Value)
	}
	return max(n, 1)
}

// overridePeriods are the periods of the override units (Envoy's RateLimitUnit), and
// responseUnits those of the units of the RateLimit answers, largest first: Envoy's
// units are the rules' (limiter.UnitPeriod), by name.
var (
	overridePeriods = unitPeriods(typev3.RateLimitUnit_name)
	responseUnits   = func() []responseUnit {
		var us []responseUnit
		for n, d := range unitPeriods(rlsv3.RateLimitResponse_RateLimit_Unit_name) {
			us = append(us, responseUnit{rlsv3.RateLimitResponse_RateLimit_Unit(n), d})
		}
		slices.SortFunc(us, func(a, b responseUnit) int { return cmp.Compare(b.d, a.d) })
		return us
	}()
)

// responseUnit is a unit of Envoy's RateLimit answers and its period.
type responseUnit struct {
	u rlsv3.RateLimitResponse_RateLimit_Unit
	d time.Duration
}

// unitPeriods maps the numbers of an Envoy unit enum, given by its generated _name
// map, to the periods limiter.UnitPeriod gives their names; UNKNOWN has none.
func unitPeriods(names map[int32]string) map[int32]time.Duration {
	out := map[int32]time.Duration{}
	for n, name := range names {
		if d, ok := limiter.UnitPeriod(name); ok {
			out[n] = d
		}
	}
	return out
}

// overrideCheck is the check of a descriptor's `limit` override: a fixed window of
// the override's unit (times its multiplier) with its own counter, keyed by the
// domain, the unit and every entry. It keeps the name and failure mode of the rule
// the descriptor reached (matched, may be nil); otherwise it is named DOMAIN.override,
// which bounds the metric labels to the domains of the rules.
func overrideCheck(domain string, d *rlcommon.RateLimitDescriptor, o *rlcommon.RateLimitDescriptor_RateLimitOverride, matched *rules.Check) (*rules.Check, error) {
	period, ok := overridePeriods[int32(o.Unit)]
	if !ok {
		return nil, fmt.Errorf("limit override: unit %v is not one of second, minute, hour, day, month, year", o.Unit)
	}
	if m := o.GetUnitMultiplier(); m != nil && m.Value > 1 {
		// The window must stay below 2^53 µs, the limiter's exact range
		// (limiter.Limit's bound on Period).
		if int64(m.Value) > (int64(1<<53*time.Microsecond)-1)/int64(period) {
			return nil, fmt.Errorf("limit override: unit_multiplier %d is too large", m.Value)
		}
		period *= time.Duration(m.Value)
	}
	rule := &rules.Rule{Name: domain + ".override", Domain: domain}
	var mode limiter.FailureMode
	if matched != nil {
		rule.Name, rule.Shadow = matched.Rule.Name, matched.Rule.Shadow
		if len(matched.Rule.Limits) > 0 {
			mode = matched.Rule.Limits[0].FailureMode
		}
	}
	if o.RequestsPerUnit == 0 {
		rule.Deny = true // Envoy: a limit of 0 allows nothing
	} else {
		rule.Limits = []limiter.Limit{{Algorithm: limiter.FixedWindow, Rate: int64(o.RequestsPerUnit), Period: period, FailureMode: mode}}
	}
	h := sha256.New()
	fmt.Fprintf(h, "sluice override v1\x00%d\x00%s", period, domain)
	for _, e := range d.Entries {
		fmt.Fprintf(h, "\x00%d:%s\x00%d:%s", len(e.Key), e.Key, len(e.Value), e.Value)
	}
	key := "sl:override:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
	var keys []string
	if !rule.Deny {
		keys = []string{key}
	}
	c, err := rules.NewCheck(rule, keys...)
	return &c, err
}

// call is what a ShouldRateLimit call allocates at once: the response and, for one
// descriptor, its status and the lookup's scratch (the descriptor's entries, up to
// two without another allocation; the check found).
type call struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	slots    [1]statusSlot
	entries  [2]rules.Entry
	descs    [1][]rules.Entry
	checks   [1]rules.Check
}

// statusSlot holds the messages of one descriptor's status: a response allocates
// those of all its descriptors at once rather than three per descriptor.
type statusSlot struct {
	at    int // the index of the descriptor's check among those charged; -1: none
	st    rlsv3.RateLimitResponse_DescriptorStatus
	limit rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
}

// ok is the status OK without a current limit.
func (s *statusSlot) ok() *rlsv3.RateLimitResponse_DescriptorStatus {
	s.st.Code = rlsv3.RateLimitResponse_OK
	return &s.st
}

// status reports dec of rule: the limit closest to running out, what remains of it,
// and the time until it resets (when over: until the request would be allowed).
func (s *statusSlot) status(rule *rules.Rule, dec decide.Decision) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := s.ok()
	if dec.Over {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if rule.Deny {
		s.limit.Name = rule.Name
		st.CurrentLimit = &s.limit
		return st
	}
	if dec.ClosestLimit < 0 {
		return st
	}
	l, d := rule.Limits[dec.ClosestLimit], dec.Closest
	st.CurrentLimit = currentLimit(&s.limit, rule.Name, l)
	st.LimitRemaining = uint32(min(max(d.Remaining, 0), 1<<32-1))
	wait := d.ResetAfter
	if !d.Allowed && d.RetryAfter != limiter.Never {
		wait = d.RetryAfter
	}
	// As durationpb.New, which would allocate.
	s.reset.Seconds, s.reset.Nanos = int64(wait/time.Second), int32(wait%time.Second)
	st.DurationUntilReset = &s.reset
	return st
}

// currentLimit writes l into out as Envoy's RateLimit: the largest unit that divides
// the period, with the multiplier for the rest (30s: SECOND × 30); UNKNOWN for
// periods that are not whole seconds.
func currentLimit(out *rlsv3.RateLimitResponse_RateLimit, name string, l limiter.Limit) *rlsv3.RateLimitResponse_RateLimit {
	out.Name, out.RequestsPerUnit = name, uint32(min(l.Rate, 1<<32-1))
	for _, u := range responseUnits {
		if l.Period%u.d == 0 {
			out.Unit = u.u
			if m := l.Period / u.d; m > 1 {
				out.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(m), 1<<32-1)))
			}
			break
		}
	}
	return out
}

// rateLimitHeaders is Envoy's header list of f, and of Retry-After and
// X-Ratelimit-Retry-After when retryAfter is not empty: what headerValues makes of
// the http.Header that decide.Fields.SetHeaders and decide.SetRetryAfter fill for the
// front door, in the same order, without the map (this is every call's cost).
func rateLimitHeaders(f decide.Fields, retryAfter string) []*corev3.HeaderValue {
	// One allocation holds the list and its messages (a HeaderValue is a hundred
	// bytes): room for four, or for six when Retry-After is there.
	if retryAfter == "" {
		h := new(struct {
			vals [4]corev3.HeaderValue
			ptrs [4]*corev3.HeaderValue
		})
		return appendHeaders(h.ptrs[:0], h.vals[:], f, "")
	}
	h := new(struct {
		vals [6]corev3.HeaderValue
		ptrs [6]*corev3.HeaderValue
	})
	return appendHeaders(h.ptrs[:0], h.vals[:], f, retryAfter)
}

// appendHeaders appends the headers of rateLimitHeaders to out, the messages in
// vals (which has room for them).
func appendHeaders(out []*corev3.HeaderValue, vals []corev3.HeaderValue, f decide.Fields, retryAfter string) []*corev3.HeaderValue {
	add := func(k, v string) {
		if v != "" {
			vals[len(out)] = corev3.HeaderValue{Key: k, Value: v}
			out = append(out, &vals[len(out)])
		}
	}
	add("ratelimit", f.RateLimit)
	add("ratelimit-policy", f.Policy)
	add("retry-after", retryAfter)
	add("x-ratelimit-limit", f.Limit)
	add("x-ratelimit-remaining", f.Remaining)
	add("x-ratelimit-retry-after", retryAfter)
	return out
}

// headerValues turns h into Envoy's header list, names in lower case (HTTP/2).
func headerValues(h http.Header) []*corev3.HeaderValue {
	out := make([]*corev3.HeaderValue, 0, len(h))
	for _, k := range sortedKeys(h) {
		for _, v := range h[k] {
			out = append(out, &corev3.HeaderValue{Key: strings.ToLower(k), Value: v})
		}
	}
	return out
}

func sortedKeys(h http.Header) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
