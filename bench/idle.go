package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Idle is the memory an idle client connection costs, in bytes of
// HeapInuse+StackInuse per connection, measured in this process.
//
// Every leg's figure includes the client's own socket and the upstream's
// side of the connection, since all of them live in this process; what a
// proxy adds is its leg's figure minus Direct's.
type Idle struct {
	Conns   int
	PerConn map[Leg]float64
}

// Added is what leg l costs per idle connection beyond a direct one.
func (m *Idle) Added(l Leg) float64 { return m.PerConn[l] - m.PerConn[Direct] }

// Line is a one-line summary.
func (m *Idle) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d conns;", m.Conns)
	for _, l := range AllLegs {
		if v, ok := m.PerConn[l]; ok {
			fmt.Fprintf(&b, " %s %.1f KiB/conn", l, v/1024)
			if l != Direct {
				fmt.Fprintf(&b, " (+%.1f KiB)", m.Added(l)/1024)
			}
			b.WriteString(";")
		}
	}
	return strings.TrimSuffix(b.String(), ";")
}

// MeasureIdle opens n raw connections per leg, has each complete a hello,
// leaves them idle and measures the growth of HeapInuse+StackInuse. The
// legs alternate over rounds and the median per leg is kept. Nothing else
// should run in the process meanwhile.
func MeasureIdle(st *Stack, legs []Leg, n, rounds int) (*Idle, error) {
	samples := make(map[Leg][]float64)
	for i := range rounds {
		for j := range legs {
			l := legs[(i+j)%len(legs)]
			v, err := idleCost(st.Addr(l), n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", l, err)
			}
			samples[l] = append(samples[l], v)
		}
	}
	m := &Idle{Conns: n, PerConn: make(map[Leg]float64)}
	for l, xs := range samples {
		m.PerConn[l] = median(xs)
	}
	return m, nil
}

// inUse settles the heap and returns HeapInuse+StackInuse. Two collections
// empty the sync.Pools (their victim caches survive one).
func inUse() uint64 {
	time.Sleep(100 * time.Millisecond) // let servers' goroutines block in their reads
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

func idleCost(addr string, n int) (float64, error) {
	hello := helloMessage()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		// Give the servers time to notice before the next measurement.
		time.Sleep(200 * time.Millisecond)
	}()
	buf := make([]byte, 64<<10)
	before := inUse()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		conns = append(conns, c)
		if err := roundTrip(c, hello, buf); err != nil {
			return 0, err
		}
	}
	after := inUse()
	return (float64(after) - float64(before)) / float64(n), nil
}

// helloMessage is an OP_MSG {hello: 1, $db: "admin"}, as a driver's
// connection handshake sends.
func helloMessage() []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt32Element(d, "hello", 1)
	d = bsoncore.AppendStringElement(d, "$db", "admin")
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return wire.AppendMsg(nil, 1, 0, 0, d)
}

// roundTrip writes req and reads one whole reply into buf.
func roundTrip(c net.Conn, req, buf []byte) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		return err
	}
	size := int(binary.LittleEndian.Uint32(buf))
	if size < wire.HeaderSize || size > len(buf) {
		return fmt.Errorf("reply of %d bytes", size)
	}
	_, err := io.ReadFull(c, buf[4:size])
	return err
}
