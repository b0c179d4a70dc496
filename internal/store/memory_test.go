package store_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild() // the kill -9 test's child process; never returns
	}
	goleak.VerifyTestMain(m)
}

func TestMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg store.Config) store.Store {
		s, err := store.NewMemory(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestConfigRejectsNonsense(t *testing.T) {
	for _, cfg := range []store.Config{
		{Retain: -1},
		{MaxModelBytes: 8},
		{MaxHeaderBytes: 1},
		{MaxNameBytes: -3},
	} {
		if _, err := store.NewMemory(cfg); err == nil {
			t.Errorf("NewMemory(%+v) succeeded, want error", cfg)
		}
	}
}
