package sniff

import (
	"fmt"
	"io"
)

// WriteForbidden answers a refused HTTP/1 request with 403 and a fixed
// text body naming the refusal's reason (one of the documented reasons,
// never bytes the client sent), and asks the client to close.
func WriteForbidden(w io.Writer, reason string) error {
	body := "isopod egress: request refused (" + reason + "); see the run's egress record\n"
	_, err := fmt.Fprintf(w, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		len(body), body)
	return err
}
