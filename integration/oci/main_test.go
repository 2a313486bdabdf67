// Package oci tests image import and stage transfer end to end: images
// the tests build, served by go-containerregistry's registry in the test
// process on loopback, imported and pushed by the real isopod, booted in
// real VMs. No Docker daemon is involved.
package oci

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
