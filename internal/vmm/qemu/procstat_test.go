package qemu

import (
	"os"
	"testing"
)

func TestParseStatStartTime(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want uint64
		ok   bool
	}{
		{
			name: "plain",
			stat: "1234 (qemu-system-x86) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 987654 0 0",
			want: 987654, ok: true,
		},
		{
			name: "name with spaces and parentheses",
			stat: "42 (a) b (c)) R 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 100 200",
			want: 55, ok: true,
		},
		{name: "truncated", stat: "42 (x) R 1 2 3", ok: false},
		{name: "no name", stat: "42 x R", ok: false},
		{
			name: "not a number",
			stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0 0",
			ok:   false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatStartTime([]byte(tt.stat))
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("got %d, %v; want %d ok=%v", got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestProcStartTimeSelf(t *testing.T) {
	v, err := procStartTime(os.Getpid())
	if err != nil || v == 0 {
		t.Fatalf("procStartTime(self) = %d, %v; want a positive tick count", v, err)
	}
	if _, err := procStartTime(-1); err == nil {
		t.Error("procStartTime(-1) succeeded")
	}
}
