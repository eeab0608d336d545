//go:build amd64 && !race

package limiter

// cas128 compares the 16-byte aligned words p with (old0, old1) and, if they are
// equal, replaces them with (new0, new1), atomically (LOCK CMPXCHG16B), and reports
// whether it did. Callers check hasCAS128 first.
//
//go:noescape
func cas128(p *[2]uint64, old0, old1, new0, new1 uint64) bool

// hasCAS128 reports whether the processor has CMPXCHG16B (every x86-64 processor
// since 2006 or so).
func hasCAS128() bool
