package storefake_test

import (
	"testing"

	"isopod/internal/store"
	"isopod/internal/store/storefake"
	"isopod/internal/store/storetest"
)

// TestConformance runs the store's conformance suite on the fake.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Target{
		New: func(t *testing.T) store.Interface {
			s, err := storefake.Open(t.TempDir(), store.Options{Version: "test-1"})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		},
		Interrupt: func(t *testing.T, s store.Interface) string {
			name, err := s.(*storefake.Store).Interrupt()
			if err != nil {
				t.Fatal(err)
			}
			return name
		},
	})
}
