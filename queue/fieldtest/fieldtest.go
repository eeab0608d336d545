// Package fieldtest holds a comparison of configurations to every field of their type,
// for the tests of the functions that decide whether a declared stream, consumer or
// queue must be updated: a field that a dependency upgrade or a new setting adds fails
// the test until it is compared or ignored with a reason.
package fieldtest

import (
	"reflect"
	"slices"
	"testing"
)

// Check checks that compared and ignored name each exported field of T once (ignored
// with the reason), that same finds a change of each compared field alone, and that
// it lets a change of each ignored field through (where one can be made: booleans,
// numbers, strings, slices, maps with string keys, pointers, and structs by their
// first field that can change). name is same's, for the messages.
func Check[T any](t *testing.T, name string, same func(have, want T) bool, base T, compared []string, ignored map[string]string) {
	t.Helper()
	typ := reflect.TypeFor[T]()
	listed := map[string]bool{}
	for _, f := range compared {
		if _, ok := ignored[f]; ok {
			t.Errorf("%s: %s is listed as compared and as ignored", name, f)
		}
		listed[f] = true
	}
	for f := range ignored {
		listed[f] = true
	}
	var fields []string
	for f := range typ.Fields() {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		fields = append(fields, f.Name)
		if !listed[f.Name] {
			t.Errorf("%s: %s.%s is new: compare it in %s or list it as ignored, with the reason", name, typ, f.Name, name)
		}
	}
	for f := range listed {
		if !slices.Contains(fields, f) {
			t.Errorf("%s: %s has no field %s any more", name, typ, f)
		}
	}
	if !same(base, base) {
		t.Fatalf("%s: the base configuration differs from itself", name)
	}
	for _, f := range compared {
		want := base
		if !perturb(reflect.ValueOf(&want).Elem().FieldByName(f)) {
			t.Errorf("%s: cannot change %s to check that it is compared", name, f)
			continue
		}
		if same(base, want) {
			t.Errorf("%s: a change of %s alone goes unseen, though it is listed as compared", name, f)
		}
	}
	for f := range ignored {
		want := base
		if perturb(reflect.ValueOf(&want).Elem().FieldByName(f)) && !same(base, want) {
			t.Errorf("%s: a change of %s alone is seen, though it is listed as ignored", name, f)
		}
	}
}

// perturb changes v to another value of its type (for a stream limit, one that limit
// does not fold into "none"), or reports that it cannot.
func perturb(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(max(v.Int(), 6) + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Slice:
		v.Set(reflect.Append(reflect.AppendSlice(reflect.MakeSlice(v.Type(), 0, v.Len()+1), v), reflect.Zero(v.Type().Elem())))
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return false
		}
		m := reflect.MakeMap(v.Type())
		for k, e := range v.Seq2() {
			m.SetMapIndex(k, e)
		}
		e := reflect.New(v.Type().Elem()).Elem()
		perturb(e) // not the zero value, which a lookup of a missing key returns too
		m.SetMapIndex(reflect.ValueOf("perturbed").Convert(v.Type().Key()), e)
		v.Set(m)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		} else {
			v.SetZero()
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() && perturb(f) {
				return true
			}
		}
		return false
	default:
		return false
	}
	return true
}
