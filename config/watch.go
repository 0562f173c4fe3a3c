package config

import (
	"context"
	"fmt"
	"os"
	"time"
)

// WatchFile signals on changed whenever the file's size or modification
// time changes, checking every interval, until ctx ends. Polling needs no
// inotify and sees a ConfigMap's symlink swap like any other change. A
// signal is dropped while the previous one is still unread: one pending
// reload covers every change before it.
func WatchFile(ctx context.Context, path string, interval time.Duration, changed chan<- struct{}) {
	stamp := func() string {
		fi, err := os.Stat(path)
		if err != nil {
			return "missing"
		}
		return fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
	}
	last := stamp()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s := stamp(); s != last {
				last = s
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}
	}
}
