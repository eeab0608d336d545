package rules

import (
	"errors"
	"strings"
)

// NewCheck returns a check of rule counted under keys, one per limit, for limits that
// no rules file holds (the per-descriptor limit override of Envoy's rate limit
// service). rule must be made for it, not taken from a Set: NewCheck records the keys
// in it.
func NewCheck(rule *Rule, keys ...string) (Check, error) {
	if len(keys) != len(rule.Limits) {
		return Check{}, errors.New("rules: NewCheck needs one key per limit")
	}
	rule.prefixes = keys
	rule.offsets = make([]int, len(keys))
	for i := 1; i < len(keys); i++ {
		rule.offsets[i] = rule.offsets[i-1] + len(keys[i-1])
	}
	rule.staticKeys = strings.Join(keys, "")
	return Check{Rule: rule, keys: rule.staticKeys}, nil
}
