package machine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
)

// Expose relays every connection accepted on ln (a listener on the host's
// loopback, say) to 127.0.0.1:guestPort in the guest, over the agent
// channel: no network is needed. It serves until ctx is done or ln is
// closed (it closes ln itself when ctx ends), then waits for the
// connections it relays to end, and returns nil after a close or ctx's
// end; when the VM's agent goes away first it closes ln and fails as
// unavailable. A connection the guest refuses (nothing listens on the port) is
// closed at once.
func (v *Machine) Expose(ctx context.Context, guestPort int, ln net.Listener) error {
	if guestPort <= 0 || guestPort > 65535 {
		return fmt.Errorf("guest port %d is outside 1..65535: %w", guestPort, errdefs.ErrInvalidArgument)
	}
	c, err := v.agent()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-c.Done():
		}
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-c.Done():
				if ctx.Err() == nil {
					return fmt.Errorf("exposing guest port %d: the VM's agent went away: %w", guestPort, errdefs.ErrUnavailable)
				}
			default:
			}
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accepting for guest port %d: %w", guestPort, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v.relay(ctx, c, guestPort, conn)
		}()
	}
}

// relay joins one host connection to a new stream to the guest port,
// passing half-closes on, until both directions have ended or either
// fails; ctx's end closes both.
func (v *Machine) relay(ctx context.Context, c *agentclient.Client, port int, conn net.Conn) {
	defer conn.Close()
	s, err := c.OpenPort(ctx, port)
	if err != nil {
		v.log.Debug("relaying to a guest port", "port", port, "err", err)
		return
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() {
		conn.Close()
		s.Close()
	})
	defer stop()
	errs := make(chan error, 2)
	go func() {
		_, err := io.Copy(s, conn)
		if err == nil {
			err = s.CloseWrite()
		}
		errs <- err
	}()
	go func() {
		_, err := io.Copy(conn, s)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok && err == nil {
			err = cw.CloseWrite()
		}
		errs <- err
	}()
	for range 2 {
		if err := <-errs; err != nil {
			// One way failed: end both, so the other copy returns.
			conn.Close()
			s.Close()
		}
	}
}
