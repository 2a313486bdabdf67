package netstack

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxFrame caps one ethernet frame on the wire (a jumbo MTU plus header).
const maxFrame = 65535 + header.EthernetMinimumSize

// frameFilter sees every inbound frame (ethernet header included) and says
// whether the stack may have it.
type frameFilter func(frame []byte) bool

// link is a stack.LinkEndpoint that carries ethernet frames over a stream
// connection, each frame prefixed by its length as a 4-byte big-endian
// integer: QEMU's "-netdev stream" format. One connection is served at a
// time; frames written while none is attached are dropped, as on a cable
// that is unplugged.
type link struct {
	mtu    uint32
	mac    tcpip.LinkAddress
	filter frameFilter

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher

	// Outbound frames are queued by the stack's goroutines and written by
	// one flusher per connection, so that a burst of segments costs one
	// write call, not one each.
	wmu     sync.Mutex
	wcond   *sync.Cond // signalled when pending grows, shrinks or conn changes
	conn    net.Conn
	pending []byte
	spare   []byte

	framesIn, framesOut, dropped atomic.Uint64
}

var _ stack.LinkEndpoint = (*link)(nil)

// maxPending bounds the queued outbound bytes; stack goroutines wait past
// it (TCP then sees the link's pace).
const maxPending = 4 << 20

func newLink(mtu uint32, mac tcpip.LinkAddress, filter frameFilter) *link {
	l := &link{mtu: mtu, mac: mac, filter: filter}
	l.wcond = sync.NewCond(&l.wmu)
	return l
}

// flush writes queued frames to c until c is no longer the link's
// connection.
func (l *link) flush(c net.Conn) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for {
		for l.conn == c && len(l.pending) == 0 {
			l.wcond.Wait()
		}
		if l.conn != c {
			return
		}
		buf := l.pending
		l.pending = l.spare[:0]
		l.wcond.Broadcast() // room for waiting writers
		l.wmu.Unlock()
		_, err := c.Write(buf)
		l.wmu.Lock()
		if cap(buf) <= 2*maxPending {
			l.spare = buf[:0]
		}
		if err != nil {
			c.Close() // the reader sees it and detaches
			return
		}
	}
}

// serve reads frames from c and delivers them until c fails or ends. c
// becomes the link's write side for that time.
func (l *link) serve(c net.Conn) error {
	l.wmu.Lock()
	l.conn = c
	l.pending = l.pending[:0]
	l.wmu.Unlock()
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		l.flush(c)
	}()
	defer func() {
		l.wmu.Lock()
		if l.conn == c {
			l.conn = nil
		}
		l.wcond.Broadcast()
		l.wmu.Unlock()
		c.Close()
		<-flushed
	}()

	r := bufio.NewReaderSize(c, 256<<10)
	frame := make([]byte, maxFrame)
	var lenBuf [4]byte
	for {
		if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("reading frame length: %w", err)
		}
		n := binary.BigEndian.Uint32(lenBuf[:])
		if n > maxFrame {
			return fmt.Errorf("frame of %d bytes is over the %d-byte limit", n, maxFrame)
		}
		if _, err := io.ReadFull(r, frame[:n]); err != nil {
			return fmt.Errorf("reading frame: %w", err)
		}
		l.deliver(frame[:n])
	}
}

func (l *link) deliver(frame []byte) {
	l.framesIn.Add(1)
	if len(frame) < header.EthernetMinimumSize || (l.filter != nil && !l.filter(frame)) {
		l.dropped.Add(1)
		return
	}
	l.mu.RLock()
	d := l.dispatcher
	l.mu.RUnlock()
	if d == nil {
		l.dropped.Add(1)
		return
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
	defer pkt.DecRef()
	hdr, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	if !ok {
		l.dropped.Add(1)
		return
	}
	eth := header.Ethernet(hdr)
	switch dst := eth.DestinationAddress(); {
	case dst == header.EthernetBroadcastAddress:
		pkt.PktType = tcpip.PacketBroadcast
	case header.IsMulticastEthernetAddress(dst):
		pkt.PktType = tcpip.PacketMulticast
	case dst == l.mac:
		pkt.PktType = tcpip.PacketHost
	default:
		pkt.PktType = tcpip.PacketOtherHost
	}
	d.DeliverNetworkPacket(eth.Type(), pkt)
}

// WritePackets implements stack.LinkWriter: frames are queued for the
// flusher.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for l.conn != nil && len(l.pending) >= maxPending {
		l.wcond.Wait()
	}
	if l.conn == nil {
		l.dropped.Add(uint64(pkts.Len()))
		return pkts.Len(), nil
	}
	wasEmpty := len(l.pending) == 0
	for _, pkt := range pkts.AsSlice() {
		size := pkt.Size()
		if size > maxFrame {
			l.dropped.Add(1)
			continue
		}
		l.pending = binary.BigEndian.AppendUint32(l.pending, uint32(size))
		for _, b := range pkt.AsSlices() {
			l.pending = append(l.pending, b...)
		}
		l.framesOut.Add(1)
	}
	if wasEmpty {
		l.wcond.Broadcast()
	}
	return pkts.Len(), nil
}

// detach closes the connection being served, if any.
func (l *link) detach() {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}

func (l *link) MTU() uint32                    { return l.mtu }
func (l *link) SetMTU(mtu uint32)              { l.mtu = mtu }
func (l *link) MaxHeaderLength() uint16        { return header.EthernetMinimumSize }
func (l *link) LinkAddress() tcpip.LinkAddress { return l.mac }
func (l *link) SetLinkAddress(tcpip.LinkAddress) {
	// The gateway's MAC is fixed at start.
}

// Capabilities: frames from a guest carry complete checksums (a stream
// netdev offers no offloads) and a unix socket cannot corrupt them, so the
// stack need not verify them again.
func (l *link) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityResolutionRequired | stack.CapabilityRXChecksumOffload
}

func (l *link) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	l.dispatcher = d
	l.mu.Unlock()
}

func (l *link) IsAttached() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.dispatcher != nil
}

func (l *link) Wait()                                   {}
func (l *link) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }
func (l *link) Close()                                  {}
func (l *link) SetOnCloseAction(func())                 {}

func (l *link) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	src := pkt.EgressRoute.LocalLinkAddress
	if src == "" {
		src = l.mac
	}
	eth.Encode(&header.EthernetFields{SrcAddr: src, DstAddr: pkt.EgressRoute.RemoteLinkAddress, Type: pkt.NetworkProtocolNumber})
}

func (l *link) ParseHeader(pkt *stack.PacketBuffer) bool {
	_, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	return ok
}
