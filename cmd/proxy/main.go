package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); builds
// without it report the module version recorded by the go command.
var version = ""

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the gateway failed to start or stopped on an error
	exitUsage   = 2 // bad flags or an invalid configuration
)

// EnvConfig names the config file when -config is not given.
const EnvConfig = "LOCKGATE_CONFIG"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, hangups()))
}

// hangups delivers SIGHUP. It is separate from the shutdown signals so a
// reload request can never be mistaken for a stop.
func hangups() <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch
}

// options are the parsed command line.
type options struct {
	configPath string
	overrides  config.Overrides
	version    bool
	check      bool
	strict     bool
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flagSet(&o, getenv)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.strict && !o.check {
		return o, errors.New("-strict applies to -check only")
	}
	return o, nil
}

// flagSet defines the command line into o. docs/CONFIGURATION.md's table
// of flags is generated from it (TestConfigurationDocIsGenerated).
func flagSet(o *options, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("lockgate", flag.ContinueOnError)
	fs.StringVar(&o.configPath, "config", getenv(EnvConfig), "YAML config `file` (env "+EnvConfig+"); none means defaults")
	fs.StringVar(&o.overrides.Listen, "listen", "", "client listener `host:port` (overrides listen)")
	fs.StringVar(&o.overrides.Admin, "admin", "", "admin HTTP listener `host:port` (overrides admin)")
	fs.StringVar(&o.overrides.UpstreamURI, "upstream", "", "upstream MongoDB connection `uri` (overrides upstream.uri)")
	fs.StringVar(&o.overrides.LogLevel, "log-level", "", "log `level`: debug, info, warn, error (overrides log.level)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.check, "check", false, "validate the configuration, check that the upstream and the lock store answer and that every policy rule matches an existing namespace, print the result and exit (0 ok, 1 a check failed, 2 invalid configuration)")
	fs.BoolVar(&o.strict, "strict", false, "with -check: policy warnings (a rule that matches no existing namespace) fail the check")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lockgate [flags]\n"+
			"       lockgate audit verify|query ... (docs/AUDIT.md)\n\n"+
			"Precedence: config file < LOCKGATE_* environment < flags.\n"+
			"Every config key has a variable: LOCKGATE_ + its path, camelCase words\n"+
			"upper-cased and joined with _ (docs/CONFIGURATION.md).\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// loadConfig merges file, environment and flags and validates the result.
// SIGHUP reuses it, so a reload sees exactly what a restart would.
func loadConfig(o options, getenv func(string) string) (*config.Config, error) {
	cfg := config.Default()
	if o.configPath != "" {
		var err error
		if cfg, err = config.Load(o.configPath); err != nil {
			return nil, err
		}
	}
	if err := cfg.ApplyEnvVars(getenv); err != nil {
		return nil, fmt.Errorf("invalid environment:\n%w", err)
	}
	cfg.Apply(o.overrides)
	if err := cfg.Validate(); err != nil {
		source := "defaults, environment and flags"
		if o.configPath != "" {
			source = o.configPath
		}
		return nil, fmt.Errorf("invalid configuration (%s):\n%w", source, err)
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, hup <-chan os.Signal) int {
	return runWith(ctx, args, getenv, stdout, stderr, hup, time.After)
}

// runWith is run with the timer of shutdownDrainDelay injected: a test
// ends the drain when it has seen it, not after a wall-clock window that a
// loaded machine can overrun.
func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, hup <-chan os.Signal,
	drainTimer func(time.Duration) <-chan time.Time) int {
	if len(args) > 0 && args[0] == "audit" {
		return runAudit(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "lockgate:", err)
		return exitUsage
	}
	if o.version {
		fmt.Fprintln(stdout, "lockgate", versionString())
		return exitOK
	}
	cfg, err := loadConfig(o, getenv)
	if err != nil {
		fmt.Fprintln(stderr, "lockgate:", err)
		return exitUsage
	}
	if o.check {
		return runCheck(ctx, cfg, o.strict, stdout)
	}
	logger, closeLog, err := gateway.OpenLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "lockgate:", err)
		return exitUsage
	}
	defer closeLog()
	logger.Info("starting lockgate", zap.String("version", versionString()), zap.String("config", o.configPath))

	// The gateway gets its own context so that a second signal, or a hung
	// drain, can be bounded here without racing the gateway's shutdown.
	gwCtx, stopGateway := context.WithCancel(context.Background())
	defer stopGateway()
	gw, err := gateway.Start(gwCtx, cfg, logger, gateway.BuildInfo(versionString()))
	if err != nil {
		logger.Error("start failed", zap.Error(err))
		return exitFailure
	}

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
			reload(o, getenv, logger, gw, cfg)
		case <-changed:
			logger.Info("configuration file changed")
			reload(o, getenv, logger, gw, cfg)
		case <-gw.Done():
			// A component failed before any signal.
			if err := gw.Wait(); err != nil {
				logger.Error("lockgate stopped", zap.Error(err))
				return exitFailure
			}
			return exitOK
		case <-ctx.Done():
			break wait
		}
	}

	if d := cfg.ShutdownDrainDelay.D(); d > 0 {
		logger.Info("draining before shutdown", zap.Duration("shutdownDrainDelay", d))
		gw.BeginDrain()
		select {
		case <-drainTimer(d):
		case <-gw.Done():
		}
	}
	timeout := cfg.ShutdownTimeout.D()
	logger.Info("shutting down", zap.Duration("timeout", timeout))
	stopGateway()
	// The gateway bounds its own drain by shutdownTimeout; the margin only
	// guards against a component that ignores its deadline.
	select {
	case <-gw.Done():
	case <-time.After(timeout + 2*time.Second):
		logger.Error("shutdown exceeded shutdownTimeout; exiting with connections still open")
		return exitFailure
	}
	if err := gw.Wait(); err != nil {
		logger.Error("shutdown finished with errors", zap.Error(err))
		return exitFailure
	}
	logger.Info("lockgate stopped")
	return exitOK
}

// reload is the SIGHUP and file-change hook: it re-reads the configuration
// exactly as a restart would and hands it to the running gateway, which
// swaps the policy without touching connections. An invalid file is
// refused, logged and counted, and the policy in force stays. Keys that
// only a restart can change are reported, not applied.
func reload(o options, getenv func(string) string, logger *zap.Logger, gw *gateway.Gateway, running *config.Config) {
	logger.Info("reload requested", zap.String("config", o.configPath))
	if o.configPath == "" {
		logger.Warn("reload ignored: no config file to re-read")
		return
	}
	cfg, err := loadConfig(o, getenv)
	if err != nil {
		gw.CountReload(false)
		logger.Error("reload refused: the running configuration stays", zap.Error(err))
		return
	}
	if err := gw.Reload(cfg); err != nil {
		logger.Error("reload refused: the running configuration stays", zap.Error(err))
		return
	}
	probe := *cfg
	probe.Policy = running.Policy
	if !reflect.DeepEqual(&probe, running) {
		logger.Warn("reload applied the policy only: other changed keys take effect on restart")
	}
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
