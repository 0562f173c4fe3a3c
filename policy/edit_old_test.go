package policy

import (
	"bytes"
	"math/rand"
	"testing"
	"time"

	"github.com/lockgate/lockgate/wire"
)

// twoStep is the path EditMessage replaced: PinStatements or
// FenceStatements, then CapMaxTime over their output.
func twoStep(msg wire.Message, cmd *wire.Command, e Edit) ([]byte, int64, error) {
	var b []byte
	var err error
	switch {
	case len(e.Fences) > 0:
		b, err = FenceStatements(msg, cmd, e.Pins, e.Fences)
	case len(e.Pins) > 0:
		b, err = PinStatements(msg, cmd, e.Pins)
	}
	if err != nil || e.MaxTimeMS <= 0 {
		return b, 0, err
	}
	var c []byte
	var capped time.Duration
	if b != nil {
		c, capped, err = CapMaxTime(b, e.MaxTimeMS)
	} else {
		c, capped, err = CapMaxTimeOf(msg, cmd, e.MaxTimeMS)
	}
	if err != nil {
		return nil, 0, err
	}
	if c == nil {
		return b, capped.Milliseconds(), nil
	}
	return c, capped.Milliseconds(), nil
}

func FuzzEditMatchesTwoStep(f *testing.F) {
	for _, s := range []int64{1, 2, 3, 42, 1000} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed int64) {
		r := rand.New(rand.NewSource(seed))
		for range 20 {
			c := genEditCase(t, r, false)
			m := clParse(t, c.raw)
			cmd, err := wire.CommandOf(m)
			if err != nil || cmd == nil {
				t.Fatalf("CommandOf: %v", err)
			}
			old, oldMS, oldErr := twoStep(m, cmd, c.edit)
			got, ms, err := EditMessage(m, cmd, c.edit)
			if (oldErr == nil) != (err == nil) {
				t.Fatalf("seed %d: two-step error %v, editor error %v", seed, oldErr, err)
			}
			if err != nil {
				continue
			}
			if ms.Milliseconds() != oldMS {
				t.Fatalf("seed %d: limit %v, two-step %dms", seed, ms, oldMS)
			}
			if !bytes.Equal(old, got) {
				t.Fatalf("seed %d: edit %+v\n two-step %x\n editor   %x", seed, c.edit, old, got)
			}
		}
	})
}
