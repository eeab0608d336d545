package dispatcher

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(processEnv) != "" {
		os.Exit(runProcess())
	}
	goleak.VerifyTestMain(m)
}
