package sessions

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
