package telemetry

import (
	"context"
	"testing"
	"time"
)

func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- Serve(ctx, "127.0.0.1:0", NewRegistry(NewDriverMetrics(""), nil)) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errCh:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if err := Serve(context.Background(), "127.0.0.1:-1", NewRegistry(nil, nil)); err == nil {
		t.Error("Serve on an invalid address: no error")
	}
}
