package main

import "testing"

func TestParsePerfStat(t *testing.T) {
	c, err := parsePerfStat("# started on Tue Dec  1 13:45:31 2026\n\n164,,raw_syscalls:sys_enter,1012020,100.00,,\n47,,context-switches,1012020,100.00,,\n")
	if err != nil || c != (kernelCounts{Syscalls: 164, Switches: 47}) {
		t.Errorf("got %+v, %v", c, err)
	}
	for _, bad := range []string{
		"",
		"164,,raw_syscalls:sys_enter,1,100.00,,\n",
		"<not counted>,,raw_syscalls:sys_enter,0,0,,\n47,,context-switches,1,100.00,,\n",
	} {
		if c, err := parsePerfStat(bad); err == nil {
			t.Errorf("%q: took it: %+v", bad, c)
		}
	}
}
