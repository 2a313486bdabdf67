package agentproto

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// The session messages at their widest fit one frame: a copy-in of the
// longest path, a job reply with both streams at JobReadMax, a job list
// of MaxJobs jobs with the longest names.
func TestSessionMessagesFitAFrame(t *testing.T) {
	code, sig := math.MinInt32, 64
	widest := JobInfo{ID: "j" + strings.Repeat("9", 19), Name: JobName([]string{strings.Repeat("\x01", 4096)}), State: JobExited,
		Pid: math.MaxInt32, ExitCode: &code, Signal: &sig, TimedOut: true, DurationMS: math.MaxInt64,
		Stdout: JobReadMax, Stderr: JobReadMax, StdoutDropped: math.MaxInt64, StderrDropped: math.MaxInt64, More: true}
	path := "/" + strings.Repeat("\xff", MaxPath-2)
	jobs := make([]JobInfo, MaxJobs)
	for i := range jobs {
		jobs[i] = widest
	}
	for _, tt := range []struct {
		name    string
		m       *Msg
		payload int
	}{
		{"put_file", &Msg{ID: math.MaxUint64, Kind: KindPutFile, Path: path, MaxBytes: math.MaxInt64, Put: &PutFile{Mode: 0o7777}}, 0},
		{"file chunk", &Msg{ID: math.MaxUint64, Kind: KindFileChunk, Offset: math.MaxInt64, EOF: true}, ChunkSize},
		{"job reply", &Msg{ID: math.MaxUint64, Kind: KindJob, JobInfo: &widest}, 2 * JobReadMax},
		{"job list", &Msg{ID: math.MaxUint64, Kind: KindJobList, Jobs: jobs}, 0},
		{"job wait", &Msg{ID: math.MaxUint64, Kind: KindJobWait, Job: widest.ID, WaitMS: MaxJobWaitMS, MaxBytes: math.MaxInt64}, 0},
	} {
		if err := WriteFrame(&bytes.Buffer{}, tt.m, make([]byte, tt.payload)); err != nil {
			t.Errorf("%s at its widest: %v", tt.name, err)
		}
	}
	for _, argv := range [][]string{{strings.Repeat("a", 1000), "b"}, {strings.Repeat("\x01é", 1000)}} {
		if n := EncodedLen(JobName(argv)); n > jobNameMax || n < jobNameMax-6 {
			t.Errorf("a long job name takes %d bytes; want about %d", n, jobNameMax)
		}
	}
	if n := JobName([]string{"sh", "-c", "echo hi"}); n != "sh -c echo hi" {
		t.Errorf("JobName = %q", n)
	}
}
