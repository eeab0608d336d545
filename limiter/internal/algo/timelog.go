package algo

// TimeLog is a ring of non-decreasing timestamps (µs) that grows as needed up to the
// most entries a decision can use, so a key costs memory in proportion to its traffic.
type TimeLog struct {
	buf  []int64
	head int // index of the oldest entry
	size int
}

func (l *TimeLog) Len() int { return l.size }

// at returns the i-th oldest timestamp.
func (l *TimeLog) At(i int) int64 { return l.buf[(l.head+i)%len(l.buf)] }

// dropThrough removes the timestamps at or before t.
func (l *TimeLog) DropThrough(t int64) {
	for l.size > 0 && l.buf[l.head] <= t {
		l.dropOldest()
	}
}

// push appends n copies of t, dropping the oldest entries beyond limit.
func (l *TimeLog) Push(t, n, limit int64) {
	n = min(n, limit)
	if want := int64(l.size) + n; want > int64(len(l.buf)) && len(l.buf) < int(limit) {
		l.grow(int(min(max(want, 2*int64(len(l.buf))), limit)))
	}
	for range n {
		if l.size == len(l.buf) {
			l.dropOldest()
		}
		l.buf[(l.head+l.size)%len(l.buf)] = t
		l.size++
	}
	for int64(l.size) > limit { // the limit was lowered since the log grew
		l.dropOldest()
	}
}

func (l *TimeLog) dropOldest() {
	l.head = (l.head + 1) % len(l.buf)
	l.size--
}

func (l *TimeLog) grow(capacity int) {
	buf := make([]int64, capacity)
	for i := range l.size {
		buf[i] = l.At(i)
	}
	l.buf, l.head = buf, 0
}
