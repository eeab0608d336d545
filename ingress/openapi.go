package ingress

import (
	_ "embed"
	"net/http"
)

// OpenAPIPath is where the admin listener serves the OpenAPI 3 document of its
// endpoints and of the front door's ticket endpoints.
const OpenAPIPath = "/sluice/v1/openapi.json"

// openAPI is the hand-written OpenAPI document; TestOpenAPI checks it against the
// routes and the real responses.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}
