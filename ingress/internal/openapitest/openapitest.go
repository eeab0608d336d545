// Package openapitest checks HTTP answers of the ingress packages against the OpenAPI
// document the admin listener serves (ingress/openapi.json).
package openapitest

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
)

// Doc is the part of an OpenAPI document the tests read.
type Doc struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas   map[string]*schema `json:"schemas"`
		Responses map[string]struct {
			Content map[string]struct {
				Schema *schema `json:"schema"`
			} `json:"content"`
		} `json:"responses"`
	} `json:"components"`
}

type operation struct {
	Responses map[string]struct {
		Ref     string `json:"$ref"`
		Content map[string]struct {
			Schema *schema `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

type schema struct {
	Ref        string             `json:"$ref"`
	Type       string             `json:"type"`
	Required   []string           `json:"required"`
	Properties map[string]*schema `json:"properties"`
	Items      *schema            `json:"items"`
	Enum       []string           `json:"enum"`
}

// Load reads the document as the admin listener serves it.
func Load(t *testing.T) *Doc {
	t.Helper()
	w := httptest.NewRecorder()
	(&ingress.Admin{Gatherer: prometheus.NewRegistry()}).Handler().ServeHTTP(w, httptest.NewRequest("GET", ingress.OpenAPIPath, nil))
	var doc Doc
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("openapi.json: %d %v", w.Code, err)
	}
	return &doc
}

func (d *Doc) resolve(s *schema) *schema {
	for s != nil && s.Ref != "" {
		s = d.Components.Schemas[strings.TrimPrefix(s.Ref, "#/components/schemas/")]
	}
	return s
}

// responseSchema returns the documented schema of a response of the media type of
// contentType (the first documented one when none matches), nil when the status is not
// documented for the operation.
func (d *Doc) responseSchema(t *testing.T, path, method string, status int, contentType string) (*schema, bool) {
	t.Helper()
	raw, ok := d.Paths[path][strings.ToLower(method)]
	if !ok {
		t.Fatalf("%s %s is not in the document", method, path)
	}
	var op operation
	if err := json.Unmarshal(raw, &op); err != nil {
		t.Fatal(err)
	}
	resp, ok := op.Responses[fmt.Sprint(status)]
	if !ok {
		return nil, false
	}
	content := resp.Content
	if resp.Ref != "" {
		content = d.Components.Responses[strings.TrimPrefix(resp.Ref, "#/components/responses/")].Content
	}
	mediaType, _, _ := strings.Cut(contentType, ";")
	if c, ok := content[strings.TrimSpace(mediaType)]; ok {
		return c.Schema, true
	}
	for _, c := range content {
		return c.Schema, true
	}
	return nil, true // no body documented
}

// check validates v against s: types, required members and enums, recursively.
func (d *Doc) check(s *schema, v any, at string) []string {
	s = d.resolve(s)
	if s == nil {
		return nil
	}
	var errs []string
	switch s.Type {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return []string{at + ": not an object"}
		}
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				errs = append(errs, at+": missing required "+r)
			}
		}
		for name, ps := range s.Properties {
			if pv, ok := m[name]; ok {
				errs = append(errs, d.check(ps, pv, at+"."+name)...)
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return []string{at + ": not an array"}
		}
		for i, e := range a {
			errs = append(errs, d.check(s.Items, e, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return []string{at + ": not a string"}
		}
		if len(s.Enum) > 0 && !slices.Contains(s.Enum, str) {
			errs = append(errs, at+": "+str+" not in the enum")
		}
	case "integer", "number":
		if _, ok := v.(float64); !ok {
			return []string{at + ": not a number"}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return []string{at + ": not a boolean"}
		}
	}
	return errs
}

// Conforms checks a recorded response against the document.
func (d *Doc) Conforms(t *testing.T, path, method string, w *httptest.ResponseRecorder) {
	t.Helper()
	s, ok := d.responseSchema(t, path, method, w.Code, w.Header().Get("Content-Type"))
	if !ok {
		t.Errorf("%s %s answered %d, which the document does not list (%s)", method, path, w.Code, w.Body)
		return
	}
	if s == nil {
		if w.Body.Len() != 0 {
			t.Errorf("%s %s %d: undocumented body %s", method, path, w.Code, w.Body)
		}
		return
	}
	ct := w.Header().Get("Content-Type")
	if !strings.Contains(ct, "json") {
		return // text bodies (metrics, healthz)
	}
	var v any
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Errorf("%s %s %d: not JSON: %v", method, path, w.Code, err)
		return
	}
	for _, e := range d.check(s, v, "body") {
		t.Errorf("%s %s %d: %s", method, path, w.Code, e)
	}
}

// PatternPath turns a ServeMux pattern into its method and OpenAPI path.
func PatternPath(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	return method, path
}
