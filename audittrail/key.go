package audittrail

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// Key is a checkpoint key: an HMAC-SHA-256 secret, or an Ed25519 key pair
// (or its public half alone, which verifies but cannot sign), and the id
// that names it in checkpoints, so that a verifier holding several keys
// (after a rotation) picks the right one.
type Key struct {
	ID string
	// Secret is the HMAC key.
	Secret []byte
	// Private signs and Public verifies Ed25519 checkpoints.
	Private ed25519.PrivateKey
	Public  ed25519.PublicKey
}

// MinKeyBytes is the shortest checkpoint secret accepted.
const MinKeyBytes = 32

// Key id prefixes: the kind of key a checkpoint names.
const (
	hmacIDPrefix    = "k-"
	ed25519IDPrefix = "e-"
)

// NewKey is the HMAC key of secret. Its id is "k-" and the first 16 hex
// digits of SHA-256 over a domain tag and the secret: it reveals nothing
// usable about the secret and changes when the secret does.
func NewKey(secret []byte) Key {
	sum := sha256.Sum256(append([]byte("lockgate-audit-key-id\x00"), secret...))
	return Key{ID: hmacIDPrefix + hex.EncodeToString(sum[:8]), Secret: secret}
}

// NewEd25519Key is the Ed25519 key of pub, with priv when it can sign
// (nil: verify only). Its id is "e-" and the first 16 hex digits of
// SHA-256 over a domain tag and the public key, so that the signer and a
// verifier holding only the public key name it alike.
func NewEd25519Key(pub ed25519.PublicKey, priv ed25519.PrivateKey) Key {
	sum := sha256.Sum256(append([]byte("lockgate-audit-key-id\x00ed25519\x00"), pub...))
	return Key{ID: ed25519IDPrefix + hex.EncodeToString(sum[:8]), Private: priv, Public: pub}
}

// CanSign reports why k cannot sign checkpoints, if it cannot.
func (k Key) CanSign() error {
	switch {
	case k.Private != nil:
		return nil
	case k.Public != nil:
		return errors.New("the checkpoint key is an Ed25519 public key, which verifies but cannot sign: give lockgate the private key")
	case len(k.Secret) < MinKeyBytes:
		return fmt.Errorf("the checkpoint key is %d bytes, at least %d are needed", len(k.Secret), MinKeyBytes)
	}
	return nil
}

// sign is a checkpoint's mac under k: hex HMAC-SHA-256 or hex Ed25519
// signature of its canonical encoding without the mac.
func (k Key) sign(r *Record) string {
	msg := r.canonical(nil, false)
	if k.Private != nil {
		return hex.EncodeToString(ed25519.Sign(k.Private, msg))
	}
	m := hmac.New(sha256.New, k.Secret)
	m.Write(msg)
	return hex.EncodeToString(m.Sum(nil))
}

// check reports whether r's mac is k's signature of r.
func (k Key) check(r *Record) bool {
	if k.Public != nil {
		sig, err := hex.DecodeString(r.MAC)
		return err == nil && len(sig) == ed25519.SignatureSize && ed25519.Verify(k.Public, r.canonical(nil, false), sig)
	}
	return hmac.Equal([]byte(k.sign(r)), []byte(r.MAC))
}

// KeyFromFile reads a checkpoint key. A PEM file holds an Ed25519 key:
// "PRIVATE KEY" (PKCS #8, as openssl genpkey -algorithm ed25519 writes
// it) signs and verifies, "PUBLIC KEY" (PKIX, openssl pkey -pubout)
// verifies only. Any other content is an HMAC secret: the file's bytes,
// white space around them ignored, at least MinKeyBytes.
func KeyFromFile(path string) (Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, err
	}
	b = bytes.TrimSpace(b)
	if bytes.HasPrefix(b, []byte("-----BEGIN ")) {
		return ed25519FromPEM(path, b)
	}
	if len(b) < MinKeyBytes {
		return Key{}, fmt.Errorf("the key in %s is %d bytes, at least %d are needed (e.g. openssl rand -hex 32 > %s)", path, len(b), MinKeyBytes, path)
	}
	return NewKey(b), nil
}

func ed25519FromPEM(path string, b []byte) (Key, error) {
	blk, rest := pem.Decode(b)
	if blk == nil || len(bytes.TrimSpace(rest)) > 0 {
		return Key{}, fmt.Errorf("%s: not one PEM block", path)
	}
	switch blk.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return Key{}, fmt.Errorf("%s: %w", path, err)
		}
		priv, ok := k.(ed25519.PrivateKey)
		if !ok {
			return Key{}, fmt.Errorf("%s: a %T, not an Ed25519 key (openssl genpkey -algorithm ed25519)", path, k)
		}
		return NewEd25519Key(priv.Public().(ed25519.PublicKey), priv), nil
	case "PUBLIC KEY":
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return Key{}, fmt.Errorf("%s: %w", path, err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return Key{}, fmt.Errorf("%s: a %T, not an Ed25519 public key", path, k)
		}
		return NewEd25519Key(pub, nil), nil
	}
	return Key{}, fmt.Errorf("%s: a PEM %q block; want PRIVATE KEY or PUBLIC KEY (Ed25519)", path, blk.Type)
}
