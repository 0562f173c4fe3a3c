package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/testserver/embedded"
)

const (
	defaultListen = "127.0.0.1:27018"
	defaultAdmin  = "127.0.0.1:9218"
)

type flags struct {
	configPath string
	listen     string
	admin      string
	dataDir    string
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var o flags
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", "", "YAML config `file`; only its lockstore (but uri), policy, log and adminAuth sections are used, and each other key it sets is named at start")
	fs.StringVar(&o.listen, "listen", defaultListen, "proxy listener `host:port`")
	fs.StringVar(&o.admin, "admin", defaultAdmin, "admin HTTP listener `host:port`")
	fs.StringVar(&o.dataDir, "data", "", "FerretDB data `dir`; empty means a temporary directory removed on exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return o, nil
}

// devConfig builds the gateway's configuration: development defaults, the
// lockstore, policy, log and adminAuth sections of the file if one is
// given, then the flags. The upstream is filled in once the embedded server runs.
// ignored lists the keys of the file that the dev stack does not use.
func devConfig(o flags) (cfg *config.Config, ignored []string, err error) {
	cfg = config.Default()
	cfg.Log = config.Log{Level: config.LogLevelInfo, Format: config.LogFormatConsole}
	if o.configPath != "" {
		file, err := config.Load(o.configPath)
		if err != nil {
			return nil, nil, err
		}
		if ignored, err = ignoredKeys(o.configPath); err != nil {
			return nil, nil, err
		}
		// Validate the file as a whole so its errors name its own keys,
		// even in sections the dev stack then ignores.
		if err := file.Validate(); err != nil {
			return nil, nil, fmt.Errorf("invalid configuration (%s):\n%w", o.configPath, err)
		}
		cfg.Lockstore, cfg.Policy, cfg.Log, cfg.AdminAuth = file.Lockstore, file.Policy, file.Log, file.AdminAuth
	} else {
		// Without a file, protect what the README's walk-through uses, so
		// that enforcement can be seen at once.
		cfg.Policy.Namespaces = []config.NamespaceRule{
			{Match: "shop.orders", Mode: config.ModeEnforce},
			{Match: "shop.*", Mode: config.ModeAudit},
		}
	}
	// Lock records live in the embedded upstream too: a dev stack that
	// wrote them to some other deployment would surprise its user.
	cfg.Lockstore.URI = ""
	cfg.Listen, cfg.Admin = o.listen, o.admin
	cfg.Upstream.URI = "mongodb://placeholder/" // replaced by the embedded URI
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid flags:\n%w", err)
	}
	return cfg, ignored, nil
}

// devIgnores says, for each key of a config file that the dev stack does
// not use, what to do instead. A user who copied a production file and
// sees its listen address or upstream silently replaced loses time
// (issue 26); one line each says why and which flag does it here.
var devIgnores = []struct{ key, instead string }{
	{"listen", "use -listen"},
	{"admin", "use -admin"},
	{"upstream", "the upstream is the embedded FerretDB (-data DIR keeps its data)"},
	{"lockstore.uri", "lock records live in the embedded upstream"},
	{"tls", "the dev stack serves plain TCP; run lockgate (cmd/proxy) with this file for TLS"},
	{"limits", "the dev stack uses the default limits; run lockgate (cmd/proxy) with this file"},
	{"shutdownTimeout", "the dev stack stops at once; run lockgate (cmd/proxy) with this file"},
	{"shutdownDrainDelay", "the dev stack stops at once; run lockgate (cmd/proxy) with this file"},
}

// ignoredKeys reads which of devIgnores' keys the file at path sets, in
// the file's own words ("listen (use -listen)"). The file was loaded and
// validated already; this only looks at which keys it names.
func ignoredKeys(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []string
	for _, ig := range devIgnores {
		if hasKey(&doc, strings.Split(ig.key, ".")) {
			out = append(out, ig.key+" ("+ig.instead+")")
		}
	}
	return out, nil
}

// hasKey reports whether the YAML document n maps the key path.
func hasKey(n *yaml.Node, path []string) bool {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if len(path) == 0 {
		return true
	}
	if n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == path[0] {
			return hasKey(n.Content[i+1], path[1:])
		}
	}
	return false
}

// Main runs the dev stack as a process: until SIGTERM or SIGINT, with
// SIGHUP reloading the policy instead of killing the process (which would
// leave its temporary data directory behind). It returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return Run(ctx, args, stdout, stderr, hup)
}

// Run runs the dev stack until ctx ends and returns the process exit code:
// 0 after a clean stop, 1 when something failed at run time, 2 for bad
// flags or configuration. Each value on hup (SIGHUP), and each change of
// the -config file, reloads the policy from the file as cmd/proxy does.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "devstack:", err)
		return 2
	}
	cfg, ignored, err := devConfig(o)
	if err != nil {
		fmt.Fprintln(stderr, "devstack:", err)
		return 2
	}
	for _, k := range ignored {
		fmt.Fprintf(stderr, "devstack: %s: ignoring %s\n", o.configPath, k)
	}
	if cfg.Lockstore.OwnerSecretFile == "" {
		// A fresh owner secret for this run, so that the dev stack starts
		// as a configured deployment would, without the warning.
		f, err := os.CreateTemp("", "lockgate-owner-secret-")
		if err != nil {
			fmt.Fprintln(stderr, "devstack:", err)
			return 1
		}
		defer os.Remove(f.Name())
		secret := make([]byte, 32)
		rand.Read(secret)
		fmt.Fprintf(f, "%x\n", secret)
		f.Close()
		cfg.Lockstore.OwnerSecretFile = f.Name()
	}
	logger, closeLog, err := gateway.OpenLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "devstack:", err)
		return 2
	}
	defer closeLog()

	up, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: o.dataDir, OnDisk: true, Logger: ferretLogger(stderr)})
	if err != nil {
		logger.Error("embedded upstream failed to start", zap.Error(err))
		return 1
	}
	defer up.Close()
	cfg.Upstream.URI = up.URI()

	gwCtx, stopGateway := context.WithCancel(context.WithoutCancel(ctx))
	defer stopGateway()
	gw, err := gateway.Start(gwCtx, cfg, logger)
	if err != nil {
		logger.Error("gateway failed to start", zap.Error(err))
		return 1
	}

	dataNote := up.Dir()
	if o.dataDir == "" {
		dataNote += ", temporary: removed on exit"
	}
	var rules []string
	for _, r := range cfg.Policy.Namespaces {
		rules = append(rules, r.Match+"="+string(r.Mode))
	}
	rules = append(rules, "default="+string(cfg.Policy.Default))
	fmt.Fprintf(stdout, "\nlockgate dev stack is running\n\n"+
		"  connection string: mongodb://%s/\n"+
		"  admin:             http://%s/  (/console/ /metrics /healthz /readyz /locks /policy)\n"+
		"  upstream:          %s  (embedded FerretDB, data in %s)\n"+
		"  policy:            %s\n\n"+
		"Press Ctrl-C to stop.\n\n",
		gw.ProxyAddr(), gw.AdminAddr(), up.URI(), dataNote, strings.Join(rules, " "))

	changed := make(chan struct{}, 1)
	if o.configPath != "" {
		wctx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		go config.WatchFile(wctx, o.configPath, 2*time.Second, changed)
	}
wait:
	for {
		select {
		case <-hup:
			reload(o, logger, gw, "SIGHUP")
		case <-changed:
			reload(o, logger, gw, "the configuration file changed")
		case <-ctx.Done():
			logger.Info("stopping dev stack")
			stopGateway()
			break wait
		case <-gw.Done():
			break wait
		}
	}
	if err := gw.Wait(); err != nil {
		logger.Error("gateway stopped with errors", zap.Error(err))
		return 1
	}
	// The deferred up.Close stops FerretDB after every proxied connection
	// has drained, so no client sees its upstream vanish mid-request.
	return 0
}

// reload re-reads the -config file as a start would and hands the result
// to the running gateway, which swaps the policy without touching
// connections; an invalid file is refused and the policy in force stays.
func reload(o flags, logger *zap.Logger, gw *gateway.Gateway, why string) {
	if o.configPath == "" {
		logger.Warn("reload ignored: the dev stack was started without -config, so there is no policy file to re-read", zap.String("trigger", why))
		return
	}
	logger.Info("reloading the policy", zap.String("trigger", why), zap.String("config", o.configPath))
	cfg, _, err := devConfig(o)
	if err != nil {
		gw.CountReload(false)
		logger.Error("reload refused: the running policy stays", zap.Error(err))
		return
	}
	if err := gw.Reload(cfg); err != nil {
		logger.Error("reload refused: the running policy stays", zap.Error(err))
		return
	}
	logger.Info("policy reloaded")
}

// ferretLogger is the embedded FerretDB's logger. FerretDB logs a great
// deal at info, and at warn it dumps every error reply it sends (each
// CommandNotFound of a capability probe), which drowns lockgate's own
// lines; its errors are what a developer needs. Its lines are prefixed so
// that nobody takes them for lockgate's.
func ferretLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(prefixWriter{prefix: []byte(ferretPrefix), w: w}, &slog.HandlerOptions{Level: slog.LevelError}))
}

const ferretPrefix = "embedded FerretDB (upstream): "

// prefixWriter starts every line written through it with prefix. slog's
// handlers write one whole record per call, so per-call is per-line.
type prefixWriter struct {
	prefix []byte
	w      io.Writer
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append(append([]byte(nil), p.prefix...), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}
