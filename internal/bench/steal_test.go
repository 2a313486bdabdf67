package bench

import "testing"

func TestStealPct(t *testing.T) {
	a, ok := parseCPULine("cpu  1044926 0 186545 3978623 12732 0 9578 84975 0 0")
	if !ok {
		t.Fatal("a /proc/stat cpu line did not parse")
	}
	if a.steal != 84975 || a.total != 1044926+186545+3978623+12732+9578+84975 {
		t.Fatalf("parsed %+v", a)
	}
	b := cpuTimes{total: a.total + 1000, steal: a.steal + 250}
	for _, c := range []struct {
		name string
		a, b cpuTimes
		want float64
	}{
		{"a quarter stolen", a, b, 25},
		{"no time passed", a, a, -1},
		{"counters went back", b, a, -1},
	} {
		if got := stealPct(c.a, c.b); got != c.want {
			t.Errorf("%s: %v; want %v", c.name, got, c.want)
		}
	}
	for _, line := range []string{"cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "intr 1 2 3 4 5 6 7 8 9", "cpu 1 2 x 4 5 6 7 8"} {
		if _, ok := parseCPULine(line); ok {
			t.Errorf("%q parsed as the aggregate cpu line", line)
		}
	}
}
