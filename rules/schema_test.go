package rules

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
)

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(JSONSchema()))
	if err != nil {
		t.Fatalf("schema.json is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema does not compile: %v", err)
	}
	return s
}

// validateYAML validates one rules file, as an editor's YAML language server would: the
// YAML is read into plain values (merge keys applied) and checked against the schema.
func validateYAML(s *jsonschema.Schema, src string) error {
	var v any
	if err := yaml.Unmarshal([]byte(src), &v); err != nil {
		return err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err // a mapping with keys that are not strings: not a rules file
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	return s.Validate(inst)
}

// TestSchemaFieldsMatchParser keeps the schema and the parser in step: every object of
// the schema lists exactly the fields the parser accepts there, so a field added to
// one and not the other fails here.
func TestSchemaFieldsMatchParser(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(JSONSchema(), &doc); err != nil {
		t.Fatal(err)
	}
	at := func(path ...string) map[string]any {
		var cur any = doc
		for _, p := range path {
			switch c := cur.(type) {
			case map[string]any:
				cur = c[p]
			case []any:
				i := int(p[0] - '0')
				if i >= len(c) {
					t.Fatalf("schema path %v: index %s out of range", path, p)
				}
				cur = c[i]
			}
		}
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("schema path %v is not an object", path)
		}
		return m
	}
	cases := []struct {
		what   string
		path   []string
		parser []string
	}{
		{"file", nil, fileFields},
		{"descriptor", []string{"$defs", "descriptor"}, descFields},
		{"rate_limit", []string{"$defs", "envoyLimit"}, envoyFields},
		{"rate_limits entry", []string{"$defs", "limit"}, limitFields},
		{"limit options", []string{"$defs", "limitOptions"}, optFields},
		{"route", []string{"$defs", "route"}, routeFields},
		{"match", []string{"$defs", "match"}, matchFields},
		{"header match", []string{"$defs", "match", "properties", "headers", "items"}, headerFields},
		{"descriptor entry", []string{"$defs", "entry"}, entryFields},
		{"queue", []string{"$defs", "queue"}, queueFields},
		{"outflow", []string{"$defs", "queue", "properties", "outflow", "anyOf", "1"}, outflowFields},
		{"backoff", []string{"$defs", "queue", "properties", "backoff"}, backoffFields},
		{"priorities", []string{"$defs", "queue", "properties", "priorities"}, priorityFields},
	}
	for _, c := range cases {
		props, _ := at(c.path...)["properties"].(map[string]any)
		var got []string
		for k := range props {
			got = append(got, k)
		}
		want := slices.Clone(c.parser)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: schema lists %v, the parser accepts %v", c.what, got, want)
		}
	}
}

// TestSchemaAcceptsWhatLoads: every example the project ships, every example of the
// package documentation (doc.go) that is a whole rules file, and every file of the Envoy parity table that sluice
// loads is valid under the schema. (The schema may accept more than Load: it cannot
// see references between files and fields.)
func TestSchemaAcceptsWhatLoads(t *testing.T) {
	s := compileSchema(t)
	type example struct{ name, src string }
	var examples []example
	files, err := filepath.Glob(filepath.Join("..", "deploy", "*", "rules", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join("..", "deploy", "rules", "*.yaml"))
	files = append(files, more...)
	if len(files) < 8 {
		t.Fatalf("found only %d example files: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		examples = append(examples, example{f, string(b)})
	}
	// The annotated example reads its callback secret from the environment.
	t.Setenv("ORDERS_CALLBACK_SECRET", "whsec_"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
	docFiles := 0
	for i, b := range packageDocCode(t) {
		if _, err := Parse(File{Name: "doc.go", Data: []byte(b)}); err == nil {
			docFiles++
			examples = append(examples, example{fmt.Sprintf("rules/doc.go code block %d", i), b})
		}
	}
	if docFiles == 0 {
		t.Error("no code block of the package documentation (rules/doc.go) is a whole rules file that loads")
	}
	parity := 0
	for _, c := range parityCases {
		for i, f := range c.files {
			if _, err := Parse(File{Name: "p.yaml", Data: []byte(f)}); err == nil {
				parity++
				examples = append(examples, example{fmt.Sprintf("%s file %d", c.name, i), f})
			}
		}
	}
	if parity < 20 {
		t.Errorf("only %d parity files load; the table should give many", parity)
	}
	for _, e := range examples {
		if _, err := Parse(File{Name: e.name, Data: []byte(e.src)}); err != nil {
			t.Errorf("%s: does not load:\n%v", e.name, err)
			continue
		}
		if err := validateYAML(s, e.src); err != nil {
			t.Errorf("%s: loads, but the schema refuses it: %v", e.name, err)
		}
	}
}

// TestSchemaRefusesInvalid: files the parser refuses for a reason a schema can express
// are refused by the schema too, so an editor marks them before sluice does.
func TestSchemaRefusesInvalid(t *testing.T) {
	s := compileSchema(t)
	const head = "domain: d\ndescriptors:\n  - key: k\n"
	cases := []struct{ name, src string }{
		{"no domain", "descriptors: []\n"},
		{"unknown top-level field", "domain: d\nroute: []\n"},
		{"top-level shadow_mode", "domain: d\nshadow_mode: true\n"},
		{"descriptor without key", "domain: d\ndescriptors:\n  - value: v\n"},
		{"unknown descriptor field", head + "    limit: 5\n"},
		{"unknown unit", head + "    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"},
		{"negative requests_per_unit", head + "    rate_limit: {unit: second, requests_per_unit: -1}\n"},
		{"requests_per_unit as text", head + "    rate_limit: {unit: second, requests_per_unit: many}\n"},
		{"unit_multiplier 0", head + "    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n"},
		{"unknown algorithm", head + "    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n"},
		{"burst 0", head + "    rate_limit: {unit: second, requests_per_unit: 1}\n    burst: 0\n"},
		{"bad on_limit", head + "    rate_limit: {unit: second, requests_per_unit: 1}\n    on_limit: drop\n"},
		{"bad failure_mode", head + "    rate_limit: {unit: second, requests_per_unit: 1}\n    failure_mode: maybe\n"},
		{"bad window", head + "    rate_limits: [{window: soon, requests_per_unit: 1}]\n"},
		{"empty rate_limits", head + "    rate_limits: []\n"},
		{"shadow_mode not a boolean", head + "    shadow_mode: sometimes\n"},
		{"bad source", "domain: d\nroutes:\n  - descriptors: [[{key: u, from: cookie:x}]]\n"},
		{"route descriptor not a list", "domain: d\nroutes:\n  - descriptors: [{key: u, value: x}]\n"},
		{"unknown match field", "domain: d\nroutes:\n  - match: {verb: POST}\n"},
		{"bad downstream", "domain: d\nqueues:\n  q: {outflow: 5/s, downstream: 'ftp://x'}\n"},
		{"bad outflow", "domain: d\nqueues:\n  q: {outflow: fast, downstream: 'nats:a'}\n"},
		{"unknown outflow field", "domain: d\nqueues:\n  q: {outflow: {speed: 5}, downstream: 'nats:a'}\n"},
		{"max_depth 0", "domain: d\nqueues:\n  q: {outflow: 5/s, max_depth: 0, downstream: 'nats:a'}\n"},
		{"bad size", "domain: d\nqueues:\n  q: {outflow: 5/s, max_body: lots, downstream: 'nats:a'}\n"},
		{"bad delivery", "domain: d\nqueues:\n  q: {outflow: 5/s, delivery: twice, downstream: 'nats:a'}\n"},
		{"unknown queue field", "domain: d\nqueues:\n  q: {outflow: 5/s, downstream: 'nats:a', retries: 3}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Parse(File{Name: "t.yaml", Data: []byte(c.src)}); err == nil {
				t.Fatalf("the parser accepts it; the case is wrong")
			}
			if err := validateYAML(s, c.src); err == nil {
				t.Errorf("the schema accepts it")
			} else if strings.TrimSpace(err.Error()) == "" {
				t.Errorf("the schema's error says nothing")
			}
		})
	}
}

// packageDocCode returns the code blocks of the package documentation (doc.go), as
// go doc shows them: the rules reference's examples.
func packageDocCode(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go: %v", err)
	}
	var code []string
	for _, b := range new(comment.Parser).Parse(f.Doc.Text()).Content {
		if c, ok := b.(*comment.Code); ok {
			code = append(code, c.Text)
		}
	}
	return code
}

// TestSchemaEnumsAreTheLimiters: the schema's algorithm names are limiter.Algorithms,
// in their order, and its unit names are the ones limiter.UnitPeriod knows, every
// unit's name among them, so that a name added to the limiter reaches the editors.
func TestSchemaEnumsAreTheLimiters(t *testing.T) {
	var schema struct {
		Defs struct {
			Algorithm struct{ Enum []string }
			Unit      struct{ Enum []string }
		} `json:"$defs"`
	}
	if err := json.Unmarshal(JSONSchema(), &schema); err != nil {
		t.Fatal(err)
	}
	if got, want := schema.Defs.Algorithm.Enum, limiter.AlgorithmNames(); !slices.Equal(got, want) {
		t.Errorf("schema algorithms %v, want limiter.Algorithms %v", got, want)
	}
	units := schema.Defs.Unit.Enum
	for _, u := range units {
		if _, ok := limiter.UnitPeriod(u); !ok {
			t.Errorf("schema unit %q: limiter.UnitPeriod does not know it", u)
		}
	}
	for _, u := range limiter.UnitNames() {
		if !slices.Contains(units, u) {
			t.Errorf("unit %q is missing from the schema's units %v", u, units)
		}
	}
}
