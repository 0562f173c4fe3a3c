// Package config defines lockgate's configuration: the YAML file that
// config.example.yaml documents, the few environment variables a container
// sets, and the validation that refuses a bad setting at start.
//
// Precedence is file, then environment (ApplyEnv), then flags (Apply);
// Validate runs last, once, on the merged result, and every error it returns
// names the offending key (policy.namespaces[2].mode, lockstore.maxLeaseMS)
// and the reason, so an operator can fix the file without reading code.
//
// The package only describes and checks settings. It must never open files
// other than the one given to Load, touch the network, resolve DNS (so a
// mongodb+srv URI is checked for shape only), start goroutines or keep
// package-level mutable state: the gateway and the binaries own all effects.
package config
