package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// stackPackage is the program the launcher builds and runs.
const stackPackage = "github.com/lockgate/lockgate/cmd/lockgate-devstack"

func main() {
	bin, err := buildStack(context.Background(), os.Stderr, time.NewTicker(progressEvery).C)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
	// Exec rather than a child process: Ctrl-C, SIGTERM and the exit code
	// belong to the dev stack itself, with no launcher in between.
	err = syscall.Exec(bin, append([]string{bin}, os.Args[1:]...), os.Environ())
	fmt.Fprintln(os.Stderr, "devstack: cannot start", bin+":", err)
	os.Exit(1)
}

// progressEvery is how often a running build reports; a build that ends
// before the first tick (a warm cache) prints nothing at all.
const progressEvery = 5 * time.Second

// buildStack builds the dev stack into the user's cache directory and
// returns the binary's path. The go command skips the link when the binary
// is already up to date.
func buildStack(ctx context.Context, stderr io.Writer, tick <-chan time.Time) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is not on PATH: %w", err)
	}
	gomod, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	modFile := strings.TrimSpace(string(gomod))
	if modFile == "" || modFile == os.DevNull {
		return "", errors.New("run it from a lockgate checkout: go run ./cmd/devstack")
	}
	modDir := filepath.Dir(modFile)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	// One binary per checkout, so that two checkouts never run each
	// other's code.
	sum := sha256.Sum256([]byte(modDir))
	bin := filepath.Join(cache, "lockgate", "devstack-"+hex.EncodeToString(sum[:6]))

	cmd := exec.CommandContext(ctx, goBin, "build", "-v", "-o", bin, stackPackage)
	cmd.Dir = modDir
	out, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("go build: %w", err)
	}
	report := reportBuild(scanLines(out), stderr, tick)
	if err := cmd.Wait(); err != nil {
		stderr.Write(report)
		return "", fmt.Errorf("building the dev stack failed (output above): %w", err)
	}
	return bin, nil
}

// scanLines delivers r's lines until it ends, then closes the channel.
func scanLines(r io.Reader) <-chan string {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

// reportBuild consumes the go command's -v output until it ends. Module
// downloads are shown as they happen; compiled packages are counted and
// the count reported on each tick, since a first build is minutes of
// otherwise silent compiling that looks like a hang. It returns everything
// else the build printed (compiler errors), for a failed build.
func reportBuild(lines <-chan string, w io.Writer, tick <-chan time.Time) []byte {
	var other bytes.Buffer
	compiled, announced := 0, false
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				if announced {
					fmt.Fprintf(w, "devstack: built (%d packages compiled)\n", compiled)
				}
				return other.Bytes()
			}
			switch {
			case strings.HasPrefix(line, "go: downloading "):
				if !announced {
					announce(w)
					announced = true
				}
				fmt.Fprintln(w, line)
			case line != "" && !strings.ContainsAny(line, " \t:"):
				compiled++ // -v prints each package's import path as it compiles
			default:
				fmt.Fprintln(&other, line)
			}
		case <-tick:
			if !announced {
				announce(w)
				announced = true
			}
			fmt.Fprintf(w, "devstack: still building: %d packages compiled so far\n", compiled)
		}
	}
}

func announce(w io.Writer) {
	fmt.Fprintln(w, "devstack: building the dev stack (embedded FerretDB + lockgate). "+
		"A first build downloads the Go modules and compiles for about two minutes; "+
		"later runs start in seconds.")
}
