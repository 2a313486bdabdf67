package machine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm/vmmfake"
)

// A session's calls through the Machine: the session mark, a kept exec,
// a background job read and waited for, a copy-in read back by a command.
func TestSessionCalls(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Session(ctx); err != nil {
		t.Fatalf("Session: %v", err)
	}
	j, err := m.StartJob(ctx, machine.Exec{Argv: []string{"/bin/sh", "-c", "echo job-out; exit 4"}, Cwd: "/"})
	if err != nil || j.ID == "" {
		t.Fatalf("StartJob: %+v, %v", j, err)
	}
	out, err := m.JobWait(ctx, j.ID, 10*time.Second, 0)
	if err != nil || out.ExitCode == nil || *out.ExitCode != 4 || string(out.Stdout) != "job-out\n" {
		t.Errorf("JobWait: %+v %q, %v", out.JobInfo, out.Stdout, err)
	}
	if list, err := m.JobList(ctx); err != nil || len(list) != 1 {
		t.Errorf("JobList: %+v, %v", list, err)
	}
	if err := m.JobKill(ctx, "j404", 9); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("JobKill of an unknown job: %v", err)
	}
	if _, err := m.JobRead(ctx, j.ID, 0); err != nil {
		t.Errorf("JobRead: %v", err)
	}

	dest := filepath.Join(t.TempDir(), "in", "file.txt")
	if n, err := m.PutFile(ctx, dest, 0o600, 1<<20, strings.NewReader("copied in\n")); err != nil || n != 10 {
		t.Fatalf("PutFile: %d, %v", n, err)
	}
	var stdout bytes.Buffer
	res, err := m.Exec(ctx, machine.Exec{Argv: []string{"/bin/sh", "-c", "cat " + dest + "; stat -c %a " + dest}, Cwd: "/",
		Timeout: 10 * time.Second, Stdout: &stdout, Keep: true})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || stdout.String() != "copied in\n600\n" {
		t.Errorf("reading the copy back: %+v %q, %v", res, stdout.String(), err)
	}
	if _, err := m.StartJob(ctx, machine.Exec{Argv: []string{"cat"}, Stdin: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a job with stdin: %v; want invalid argument", err)
	}
}

// Expose relays host connections to a guest port over the agent channel;
// the fake guest's loopback is the host's, so a test server stands in for
// the guest's.
func TestExpose(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "guest says "+r.URL.Path)
	}))
	defer srv.Close()
	guestPort := srv.Listener.Addr().(*net.TCPAddr).Port
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	ectx, stop := context.WithCancel(ctx)
	go func() { served <- m.Expose(ectx, guestPort, ln) }()
	for i := range 3 {
		resp, err := http.Get(fmt.Sprintf("http://%s/%d", ln.Addr(), i))
		if err != nil {
			t.Fatalf("GET through the relay: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != fmt.Sprintf("guest says /%d", i) {
			t.Errorf("body %q", body)
		}
	}
	stop()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Expose: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Expose did not return after its context ended")
	}
	if err := m.Expose(ctx, 0, ln); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("port 0: %v", err)
	}
}

// Expose ends, unavailable, when the VM goes away.
func TestExposeEndsWithTheVM(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	// A port nothing listens on: the relay closes the connection, which
	// shows Expose serving.
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	go func() { served <- m.Expose(context.Background(), port, ln) }()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("a connection to a closed guest port: %d, %v; want EOF", n, err)
	}
	conn.Close()
	m.Close()
	select {
	case err := <-served:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Expose after the VM ended: %v; want unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Expose did not return after the VM ended")
	}
}

// A fake guest's background jobs end with its machine, as a real guest's
// do.
func TestFakeJobsEndWithTheMachine(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := m.StartJob(ctx, machine.Exec{Argv: []string{"sleep", "100"}, Cwd: "/"})
	if err != nil || j.Pid <= 0 {
		t.Fatalf("StartJob: %+v, %v", j, err)
	}
	m.Close()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(j.Pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(j.Pid, syscall.SIGKILL)
			t.Fatalf("the job (pid %d) outlived its machine", j.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
