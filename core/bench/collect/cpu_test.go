package collect

import (
	"context"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestTargetCPU: a spinning process counts as busy, a sleeping one as
// quiet.
func TestTargetCPU(t *testing.T) {
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { spin.Process.Kill(); spin.Wait() }()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	ctx := context.Background()
	busy, err := TargetCPU(ctx, []int{spin.Process.Pid}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := TargetCPU(ctx, []int{sleep.Process.Pid}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A spinning process uses at most one of the machine's cores: with
	// nothing else running about that share, under load (the test runs
	// beside other packages' tests) less, but clearly more than nothing.
	if most := 100 / float64(runtime.NumCPU()); busy < 5 || busy > most*1.1+1 || idle > 1 {
		t.Fatalf("spinning process %.1f%% of the machine (want 5%% to %.0f%%), sleeping one %.1f%% (want under 1%%)", busy, most, idle)
	}
}
