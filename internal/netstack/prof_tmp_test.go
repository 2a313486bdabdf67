package netstack

import (
	"os"
	"runtime/pprof"
	"testing"
)

func TestMain(m *testing.M) {
	if p := os.Getenv("NS_PROF"); p != "" && os.Getenv("ISOPOD_TESTNET_CHILD") == "1" {
		f, _ := os.Create(p)
		pprof.StartCPUProfile(f)
		code := m.Run()
		pprof.StopCPUProfile()
		f.Close()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
