package headermap

import (
	"fmt"
	"net/http"
	"testing"
)

func TestReset(t *testing.T) {
	if h := Reset(nil); h == nil || len(h) != 0 {
		t.Fatalf("Reset(nil) = %v, want an empty map", h)
	}
	small := http.Header{"A": {"1"}, "B": {"2"}}
	if h := Reset(small); len(h) != 0 || len(small) != 0 {
		t.Fatalf("a small map: %v, want it cleared and returned", h)
	}
	small["C"] = []string{"3"}
	if len(Reset(small)) != 0 {
		t.Fatal("the returned map is not the one given")
	}
	big := http.Header{}
	for i := range MaxReused + 1 {
		big[fmt.Sprint("F", i)] = []string{"v"}
	}
	if h := Reset(big); len(h) != 0 || len(big) != MaxReused+1 {
		t.Fatalf("a map past MaxReused: got %d fields, the old one %d; want a new empty one, the old left", len(h), len(big))
	}
}
