package vmrecord

import (
	"os"
	"testing"
)

func TestParseStatStartTime(t *testing.T) {
	line := "1234 (qemu (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 3 0 987654 100000 50"
	if got := parseStatStartTime(line); got != 987654 {
		t.Errorf("got %d; want 987654", got)
	}
	if got := parseStatStartTime("garbage"); got != 0 {
		t.Errorf("garbage: got %d", got)
	}
	if ProcStartTime(os.Getpid()) == 0 {
		t.Errorf("no start time for this process")
	}
}
