package config

import (
	"fmt"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Mode is how the policy treats writes on a namespace.
type Mode string

const (
	// ModeOff passes everything through untouched.
	ModeOff Mode = "off"
	// ModeAudit decides, logs and counts, but forwards unchanged.
	ModeAudit Mode = "audit"
	// ModeEnforce rejects writes that are not covered by the caller's locks.
	ModeEnforce Mode = "enforce"
)

// Modes lists the valid modes, weakest first.
func Modes() []Mode { return []Mode{ModeOff, ModeAudit, ModeEnforce} }

// Valid reports whether m is one of Modes.
func (m Mode) Valid() bool { return slices.Contains(Modes(), m) }

// InsertMode is what an insert into a protected namespace needs.
type InsertMode string

const (
	// InsertsAllow lets inserts through: a new document has no lock yet.
	InsertsAllow InsertMode = "allow"
	// InsertsRequireUnlocked refuses an insert whose _id another session
	// has locked, so that lock-then-insert is safe.
	InsertsRequireUnlocked InsertMode = "requireUnlocked"
)

// InsertModes lists the valid insert modes.
func InsertModes() []InsertMode { return []InsertMode{InsertsAllow, InsertsRequireUnlocked} }

// Valid reports whether m is one of InsertModes.
func (m InsertMode) Valid() bool { return slices.Contains(InsertModes(), m) }

// FenceMode says whether an enforced namespace's documents carry their
// lock holder's fencing token.
type FenceMode string

const (
	// FenceNone: locks are checked by the proxy only.
	FenceNone FenceMode = "none"
	// FenceDocument: acquireLock stamps the token into the locked
	// documents and every enforced write applies only where the stamp is
	// the writer's, so the database itself refuses a stale holder.
	FenceDocument FenceMode = "document"
)

// DefaultFenceField is the field that carries the stamp by default.
const DefaultFenceField = "_lockgateToken"

// FenceModes lists the valid fence modes.
func FenceModes() []FenceMode { return []FenceMode{FenceNone, FenceDocument} }

// Valid reports whether m is one of FenceModes.
func (m FenceMode) Valid() bool { return slices.Contains(FenceModes(), m) }

// ClientAuth is how the client listener treats client certificates.
type ClientAuth string

const (
	// ClientAuthNone never asks for a client certificate.
	ClientAuthNone ClientAuth = "none"
	// ClientAuthRequest asks for one and verifies it against caFile when the
	// client sends one; clients without a certificate are still accepted.
	ClientAuthRequest ClientAuth = "request"
	// ClientAuthRequireAndVerify refuses clients without a certificate
	// signed by a CA in caFile (mutual TLS).
	ClientAuthRequireAndVerify ClientAuth = "require-and-verify"
)

// ClientAuths lists the valid ClientAuth values.
func ClientAuths() []ClientAuth {
	return []ClientAuth{ClientAuthNone, ClientAuthRequest, ClientAuthRequireAndVerify}
}

// Valid reports whether a is one of ClientAuths.
func (a ClientAuth) Valid() bool { return slices.Contains(ClientAuths(), a) }

// LogLevel is the minimum level logged.
type LogLevel string

const (
	LogLevelDebug LogLevel = "debug"
	LogLevelInfo  LogLevel = "info"
	LogLevelWarn  LogLevel = "warn"
	LogLevelError LogLevel = "error"
)

// LogLevels lists the valid levels, most verbose first.
func LogLevels() []LogLevel {
	return []LogLevel{LogLevelDebug, LogLevelInfo, LogLevelWarn, LogLevelError}
}

// Valid reports whether l is one of LogLevels.
func (l LogLevel) Valid() bool { return slices.Contains(LogLevels(), l) }

// LogFormat is the encoding of log lines.
type LogFormat string

const (
	// LogFormatJSON is one JSON object per line, for production collectors.
	LogFormatJSON LogFormat = "json"
	// LogFormatConsole is human-readable, for development.
	LogFormatConsole LogFormat = "console"
)

// LogFormats lists the valid formats.
func LogFormats() []LogFormat { return []LogFormat{LogFormatJSON, LogFormatConsole} }

// Valid reports whether f is one of LogFormats.
func (f LogFormat) Valid() bool { return slices.Contains(LogFormats(), f) }

// Duration is a time.Duration written in YAML as a Go duration string
// ("15s", "1m30s"). Bare numbers are refused: "15" could mean seconds or
// milliseconds, and guessing wrong by a factor of 1000 is how outages start.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d the way the file writes it.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a duration string. Failures are reported as a
// yaml.TypeError with the line, so Parse can add the key's name.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf(
			"line %d: want a duration string such as \"15s\", got %q", n.Line, n.Value)}}
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf(
			"line %d: want a duration string such as \"15s\", got %q", n.Line, n.Value)}}
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a duration string, so a dumped config parses back.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
