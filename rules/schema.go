package rules

import (
	_ "embed" // the JSON Schema of rules files
	"slices"
)

//go:embed schema.json
var schemaJSON []byte

// JSONSchema returns the JSON Schema (draft 2020-12) of a rules file, for editors that
// validate and complete YAML (for example with a `# yaml-language-server: $schema=…`
// comment). It describes each file on its own; Load remains the authority, since it
// also checks what a schema cannot: references between queues, routes and descriptors.
func JSONSchema() []byte { return slices.Clone(schemaJSON) }
